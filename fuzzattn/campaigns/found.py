"""What campaigns find: a counterexample (a failing judged case and its file), and a Campaign
(what fuzzing one implementation found: its defects, refusals and pruned draws)."""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from fuzzattn.campaigns import cause_files, regression_file
from fuzzattn.campaigns.cause_shrink import shrink_cause
from fuzzattn.campaigns.defects import DefectBook
from fuzzattn.campaigns.failure_message import failure_message
from fuzzattn.contract.known_defects import HIT, PASSED_OVER, REFUSED, kind
from fuzzattn.judgement.judge import JudgedCase


class Counterexample(AssertionError):
    """A case on which an implementation failed a check; carries the judged case and its file."""
    # pytest's one-line summary of a failure starts with the exception's module path: the public one
    __module__ = "fuzzattn"

    def __init__(self, judged: JudgedCase, written: regression_file.Written | None):
        self.judged = judged
        self.written = written
        super().__init__(failure_message(judged, written))

    @property
    def path(self) -> Path | None:
        return self.written.path if self.written is not None else None


class Refused(Exception):
    """A drawn case the implementation refused with a declared error (raised outside Hypothesis)."""


def save(judged: JudgedCase, directory=None) -> regression_file.Written:
    """Write the judged failure as a regression file (create-if-absent, with fallback)."""
    return regression_file.write(regression_file.from_judged(judged), directory)


@dataclasses.dataclass
class Campaign:
    """What fuzzing one implementation (and one dtype) found."""
    impl: str
    cases: int                          # cases judged, shrinking included
    seconds: float
    counterexample: Counterexample | None = None
    cases_to_first_failure: int | None = None
    error: str | None = None            # the campaign could not run (e.g. nothing drawable)
    budget_hit: bool = False            # the time cap stopped it before max_examples
    # what ended it: "time" (the cap), "cases" (max_examples drawn), "first failure"
    # (stop_at_first), "exhausted" (Hypothesis found no further distinct case)
    ended: str = ""
    refused: dict[str, int] = dataclasses.field(default_factory=dict)   # summary -> draws
    # judged cases whose gradients a known defect kept unjudged here: its summary -> cases
    forward_only: dict[str, int] = dataclasses.field(default_factory=dict)
    # every distinct defect found (campaigns/defects.py), the first one `counterexample`'s
    defects: list = dataclasses.field(default_factory=list)
    # draws whose configuration did not compile for them (campaigns/pruned.py):
    # (configuration, error type, case class) -> draws
    pruned: dict = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.counterexample is None and self.error is None

    @property
    def refused_total(self) -> int:
        return sum(self.refused.values())

    def refusal_note(self) -> str:
        """'12% of draws refused: RuntimeError: No available kernel (30)', then the shares
        passed over, tallied to or judged without gradients for known upstream defects, or ''
        when there were none of these."""
        drawn = self.refused_total + self.cases
        shares = [(what, {s: n for s, n in self.refused.items() if kind(s) == what}) for what in
                  (REFUSED, HIT, PASSED_OVER)]
        shares.append(("judged without gradients", self.forward_only))
        notes = []
        for what, counts in shares:
            if counts:
                top = ", ".join(f"{summary} ({n})" for summary, n in
                                sorted(counts.items(), key=lambda kv: -kv[1])[:2])
                notes.append(f"{100 * sum(counts.values()) / drawn:.0f}% of draws {what}: {top}")
        return "; ".join(notes)

    @property
    def mostly_refused(self) -> bool:
        """More draws refused or passed over than judged (known defects' judged hits aside)."""
        hits = sum(n for s, n in self.refused.items() if kind(s) == HIT)
        return self.refused_total - hits > self.cases


def record(book: DefectBook, counterexample: Counterexample, judge, **kw):
    """Add a counterexample to the campaign's defects (DefectBook.add) and settle its file: one
    file per cause (campaigns/cause_files.py)."""
    defect = book.add(counterexample, judge, **kw)
    duplicate = defect.counterexample is not counterexample
    cause_files.settle(counterexample, defect.signature,
                       duplicate_of=defect.counterexample if duplicate else None)
    return defect


def fold_mixtures(book: DefectBook) -> None:
    """DefectBook.fold_mixtures, and the files of the defects folded away removed."""
    for defect in book.fold_mixtures():
        cause_files.discard(defect.counterexample)


def report_stashed(book: DefectBook, stash: dict, judge, save_to_file: bool, regressions_dir,
                   judged_so_far: int) -> None:
    """New failures met while another was shrinking and never found again by a later round (the
    budget ended first): each becomes a defect as drawn, unshrunk, unless one found since
    explains it."""
    for judged in list(stash.values()):
        if book.owner(judged) is None:
            written = save(judged, regressions_dir) if save_to_file else None
            record(book, Counterexample(judged, written), judge, shrunk=False,
                   found_at=judged_so_far)
    stash.clear()


def finish_shrinks(book: DefectBook, judge, save_to_file: bool, regressions_dir, *,
                   seconds: float | None) -> None:
    """Give each defect reported as drawn, or whose Hypothesis shrink was cut short, its own
    shrink holding to its cause (campaigns/cause_shrink.py), the causes sharing `seconds` (None:
    each bounded by judged cases alone). A smaller case found replaces the defect's file."""
    unfinished = [d for d in book.defects if not d.shrunk or d.shrink_note]
    for defect in unfinished:
        drawn = defect.judged.case
        gradients = defect.check_key.startswith("grad_")
        share = None if seconds is None else seconds / len(unfinished)
        result = shrink_cause(defect.judged, functools.partial(book.holds, defect),
                              lambda case: judge(case, gradients), book.caps, seconds=share)
        if result.judged.case != drawn:
            cause_files.discard(defect.counterexample)
            written = save(result.judged, regressions_dir) if save_to_file else None
            defect.counterexample = Counterexample(result.judged, written)
            cause_files.settle(defect.counterexample, defect.signature)
        defect.shrunk = result.complete or result.steps > 0
        defect.shrink_note = result.note(drawn)
