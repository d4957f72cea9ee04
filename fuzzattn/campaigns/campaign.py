"""Fuzzing campaigns: judge drawn cases, turn the shrunk failure into a regression file.

`check_case` is what every Hypothesis test body calls. Hypothesis runs the minimal failing
example one last time with `is_final` set after shrinking; only that run writes a file, so
`regressions/` receives the shrunk case and never the intermediate ones.

A case is judged once per process (campaigns/verdicts.py: judge_once). Cases an implementation
refuses with one of its declared errors (`Capabilities.refusals`) are counted per campaign and
rejected (Hypothesis draws another), never counted as passes; so are cases a known upstream
defect covers that cannot be judged here.

`fuzz` runs a campaign outside pytest (the CLI's commands) within a case and/or time budget.

Isolation (fuzzattn.isolation.supervisor): `fuzz(isolate=True)` or `use_workers(pool)` judge in
worker processes, with the memo keyed as in-process.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import time

from hypothesis import Phase, given, reject, seed as hypothesis_seed, settings, strategies as st
from hypothesis import currently_in_test_context
from hypothesis.errors import FlakyFailure, HypothesisException

from fuzzattn.campaigns import hypothesis_internals
from fuzzattn.campaigns.defects import DefectBook, check_key, failure_keys, same_symptom
from fuzzattn.campaigns.found import (Campaign, Counterexample, Refused,  # noqa: F401 (public)
                                      finish_shrinks, fold_mixtures, record, report_stashed, save)
from fuzzattn.campaigns.pooled import run_judge, use_workers  # noqa: F401 (public)
from fuzzattn.campaigns.pruned import Pruned as _Pruned
from fuzzattn.campaigns.verdicts import (drawn_counts, forward_only_counts,  # noqa: F401 (public)
                                         forget_verdicts, is_final_run, judge_once, refusal_counts)
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.implementation import Implementation
from fuzzattn.judgement.judge import JudgedCase
from fuzzattn.platform.gc_tuning import freeze_long_lived
from fuzzattn.run.loader import findable_spec

# A failure's explanation names the kernel's lines, not the harness's (hypothesis_internals).
hypothesis_internals.install()

# Shrinking's shares of a time cap: a round's shrink may take a quarter (a cause met early must
# not starve the search), and the causes left cut short or unshrunk share 15% more past the cap.
ROUND_SHRINK_SHARE = 0.25
FINISH_SHRINK_SHARE = 0.15


def check_case(impl: Implementation, case: AttentionCase, *, save_to_file: bool = True,
               regressions_dir=None, device=None, judge_fn=None,
               gradients: bool = True) -> JudgedCase:
    """Judge one case; raise Counterexample on failure (writing a file on the final run).
    `judge_fn` as in judge_once; by default the run's worker pool if it covers `impl`.
    gradients=False judges the forward only (a declared backward has its own test)."""
    __tracebackhide__ = True        # a failure's traceback ends in the caller's test
    judged = judge_once(impl, case, device=device,
                        judge_fn=judge_fn or run_judge(impl), gradients=gradients)
    return _raise_unless_passed(impl, case, judged, save_to_file=save_to_file,
                                regressions_dir=regressions_dir)


def _raise_unless_passed(impl: Implementation, case: AttentionCase, judged: JudgedCase, *,
                         save_to_file: bool, regressions_dir) -> JudgedCase:
    """check_case's verdict on an already judged case: returns it when it passed, else raises
    (a skip, a refusal, a Counterexample with its file written on the final run)."""
    __tracebackhide__ = True
    if judged.skipped is not None:
        raise RuntimeError(f"{case} was drawn but cannot run: {judged.skipped}")
    if judged.refused is not None:
        refusal_counts[(impl.name, judged.refused)] += 1
        if currently_in_test_context():
            reject()               # not a pass: Hypothesis draws another case
        raise Refused(judged.refused)
    if judged.forward_only is not None:
        forward_only_counts[(impl.name, judged.forward_only)] += 1
    if not judged.passed:
        written = None
        if save_to_file and is_final_run():    # file and replay name it as --impl finds it
            judged = dataclasses.replace(judged, cli_name=findable_spec(impl))
            written = save(judged, regressions_dir)
        raise Counterexample(judged, written)
    return judged


def fuzz(impl: Implementation, strategy: st.SearchStrategy[AttentionCase], *, max_examples: int | None,
         seconds: float | None = None, hypothesis_seed_value: int | None = 0,
         save_to_file: bool = True, regressions_dir=None, device=None,
         shrink: bool = True, isolate: bool = False, timeout: float | None = None,
         stop_at_first: bool = True, first_cases=(),
         judge_fn=None, gradient_every: int = 1, database=None,
         database_key: bytes | None = None, rotation=None) -> Campaign:
    """Judge up to `max_examples` drawn cases (None: no limit, `seconds` alone ends it), or until
    `seconds` pass, and shrink the first failure; `Campaign.ended` says which ended it. Once the time cap is spent, draws are no longer judged: before a failure the search
    ends at the next draw; during shrinking the shrink winds down, and Hypothesis's final replay
    of the smallest failure found so far is still judged, reported and saved.

    `stop_at_first=False` keeps going after a counterexample until the budget ends, in rounds
    (each a Hypothesis run with the budget left and its own seed), and reports every distinct
    defect once (`Campaign.defects`, campaigns/defects.py): a failure that a defect already found
    explains is tallied to it and passes; a new one is shrunk and saved. While a round shrinks,
    a failure with another check is kept for later, never shrunk toward. `first_cases` are
    judged before any draw and saved unshrunk when they fail (the load probe's case).

    `isolate`: judge every case in one supervised worker process, reused across the campaign's
    cases, so a hang (no result within `timeout` s, default isolation.DEFAULT_TIMEOUT), a dead
    process or a CUDA fault is a verdict that is shrunk and saved like any other. In-process (the
    default) a hanging kernel cannot be interrupted, so `timeout` without `isolate` is refused.
    The worker's start-up precedes the campaign's clock. `judge_fn(case)` judges through a
    caller's own (e.g. shared) IsolatedJudge instead.

    Gradients (implementations declaring a backward) are judged on every case by default;
    `gradient_every=N` judges them on one drawn case in N (chosen by the case's key, so a
    replay of a case judges what its first judgement did), for throughput campaigns where a
    backward costs several forwards. Once a failure of the forward is found, the rest of the
    campaign (its shrinking) judges the forward only: a smaller case that fails only in its
    gradients is another bug, and shrinking toward it would lose the one found.

    `database`: a Hypothesis ExampleDatabase (a seeded campaign only; None: no memory between
    runs), its failures under `database_key` (default: the cli name, which survives code edits)
    replayed first. Each defect left cut short or unshrunk gets its own shrink (found.py).

    `rotation` (campaigns/rotation.RotatingCases, whose `strategy()` `strategy` draws through):
    every `rotation.rotation.every` drawn cases the campaign moves on to its next palette, in a
    round of its own."""
    if gradient_every < 1:
        raise ValueError(f"gradient_every={gradient_every} must be at least 1")
    if (unsupported := hypothesis_internals.campaign_internals_supported()) is not None:
        raise RuntimeError(unsupported)
    if timeout is not None and not isolate:
        raise ValueError("timeout needs isolate=True: a call in this process cannot be interrupted")
    if max_examples is None and seconds is None:
        raise ValueError("max_examples=None needs seconds: nothing else would end the campaign")
    with contextlib.ExitStack() as stack:
        if isolate and judge_fn is None:
            from fuzzattn.isolation.supervisor import DEFAULT_TIMEOUT, IsolatedJudge
            judge_fn = stack.enter_context(IsolatedJudge(
                impl, timeout=timeout or DEFAULT_TIMEOUT, device=device)).judge
        rounds = _Rounds(impl, strategy, max_examples=max_examples, seconds=seconds,
                         hypothesis_seed_value=hypothesis_seed_value, save_to_file=save_to_file,
                         regressions_dir=regressions_dir, device=device, shrink=shrink,
                         stop_at_first=stop_at_first, judge_fn=judge_fn,
                         gradient_every=gradient_every, database=database,
                         database_key=database_key, rotation=rotation)
        rounds.judge_first(first_cases)
        return rounds.run()


UNBOUNDED = 2**31 - 1     # Hypothesis's max_examples for a campaign only its time cap ends


class _TimeIsUp(BaseException):
    """Raised from a campaign's test body once its time cap is spent before any failure: it ends
    the search at once (returning would pass later draws unjudged, ~1 ms each, up to
    max_examples). A BaseException, so that Hypothesis propagates it, never shrinks it."""


class _Rounds:
    """One campaign's search, its steps in order: the first cases, then rounds (each a Hypothesis
    run with the budget left and its own seed) until the budget ends or a round finds nothing
    new, then what it found (fuzz's docstring). `body` is the @given test's body: it judges a
    case, tallies a known defect's hit, and lets a new failure be shrunk."""

    def __init__(self, impl, strategy, *, max_examples, seconds, hypothesis_seed_value,
                 save_to_file, regressions_dir, device, shrink, stop_at_first, judge_fn,
                 gradient_every, database=None, database_key=None, rotation=None):
        self.impl, self.seconds, self.seed = impl, seconds, hypothesis_seed_value
        self.save_to_file, self.regressions_dir, self.device = save_to_file, regressions_dir, device
        self.shrink, self.stop_at_first, self.judge_fn = shrink, stop_at_first, judge_fn
        self.gradient_every, self.rotation = gradient_every, rotation
        self.limit = UNBOUNDED if max_examples is None else max_examples
        self.judged = self.drawn = 0        # drawn: judged outside shrinking (the case budget)
        self.first: int | None = None       # cases judged when the first defect was found
        self.over = False                   # the time cap is spent
        # the round's: the symptom (check key, failure keys) its shrink holds to
        # (defects.same_symptom), None before its first new failure; whether its first failure
        # was raised and was the forward's; whether its shrink wound down early
        self.target, self.raised, self.forward_failed, self.cut = None, False, False, False
        self.shrink_start = 0.0
        self.with_gradients: dict[str, bool] = {}
        self.refused: collections.Counter[str] = collections.Counter()
        self.forward_only: collections.Counter[str] = collections.Counter()
        self.book = DefectBook(impl.caps, self.variant_judge)
        self.pruned = _Pruned()
        self.tallied: set[str] = set()      # case keys already counted as a known defect's hit
        self.stash: dict[str, JudgedCase] = {}   # new failures met while shrinking another
        self.test = self._decorated(strategy, database, database_key)
        freeze_long_lived()     # before the clock: once per process (fuzzattn/platform/gc_tuning.py)
        self.start = time.perf_counter()

    def variant_judge(self, variant, gradients):     # a defect's trigger and cure tests
        return judge_once(self.impl, variant, device=self.device, judge_fn=self.judge_fn,
                          gradients=gradients)

    def over_budget(self) -> bool:
        self.over = self.over or (self.seconds is not None
                                  and time.perf_counter() - self.start > self.seconds)
        return self.over

    def _winding_down(self) -> bool:
        """The cap is spent, or the round's shrink has taken its share of it."""
        return self.over_budget() or (
            self.target is not None and self.seconds is not None
            and time.perf_counter() - self.shrink_start > ROUND_SHRINK_SHARE * self.seconds)

    def _decorated(self, strategy, database, database_key):
        phases = None if self.shrink else [Phase.explicit, Phase.reuse, Phase.generate]
        # report_multiple_bugs off: one campaign reports one counterexample; shrink it at once.
        def campaign(case):               # a plain function: what @given expects to wrap
            return self.body(case)

        test = settings(max_examples=self.limit, database=None, deadline=None, print_blob=False,
                        derandomize=self.seed is None, report_multiple_bugs=False,
                        **({"phases": phases} if phases else {}))(given(strategy)(campaign))
        hypothesis_internals.use_database_key(test, database_key or self.impl.cli_name.encode())
        if self.seed is not None:
            test = hypothesis_seed(self.seed)(test)
            # @seed turns the example database off; a seeded campaign keeps the one it was given
            # (a derandomized one has none: Hypothesis refuses the pair)
            hypothesis_internals.use_settings(test, settings(
                hypothesis_internals.settings_of(test), database=database))
        return test

    def body(self, case):
        final = hypothesis_internals.final_run()
        if not final and self._winding_down():
            if self.target is None:
                raise _TimeIsUp          # before any new failure: the search ends here
            # While shrinking, unjudged draws pass: no candidate can improve on the smallest
            # failure so far, so the shrink winds down and its final replay is still judged.
            self.cut = True
            return
        if self.pruned.seen(case):
            reject()                     # a configuration already seen not to compile for it
        # Decided once per case: Hypothesis's replays of a case must meet the same judgement.
        key = case.key()
        if key not in self.with_gradients:
            self.with_gradients[key] = not self.forward_failed and (
                # the key is a sha256 prefix: the same choice in every process and run
                self.gradient_every == 1 or int(key, 16) % self.gradient_every == 0)
        # One memo lookup a case: check_case's verdict on the judgement made here.
        judged = judge_once(self.impl, case, device=self.device, judge_fn=self.judge_fn,
                            gradients=self.with_gradients[key])
        if judged.refused is not None:
            if not self.pruned.record(case, judged.refused):
                self.refused[judged.refused] += 1
            reject()
        if judged.forward_only is not None:
            self.forward_only[judged.forward_only] += 1
        self.judged += 1
        if self.target is None:
            self._count_drawn()
        if judged.failures and judged.skipped is None and not final and not self._new(judged):
            return
        try:
            _raise_unless_passed(self.impl, case, judged, save_to_file=self.save_to_file,
                                 regressions_dir=self.regressions_dir)
        except Counterexample as found:
            self.first = self.first or self.judged
            if not self.raised:          # the round's first: what its shrink holds to
                self.raised = True
                first = found.judged.first_failure
                self.forward_failed = not (first and first.check.startswith("grad_"))
            raise

    def _new(self, judged) -> bool:
        """Whether a failure is for this round's shrink: not a known defect's (tallied to it),
        not another new one met while shrinking (kept for later)."""
        owner, alone = self.book.assign(judged)
        if owner is not None:            # a defect found already: tallied, not shrunk again
            if self.target is None and judged.case.key() not in self.tallied:
                self.tallied.add(judged.case.key())
                owner.hits += 1
                if alone:
                    owner.showed(judged)
            return False
        if self.target is None:
            self.target = (check_key(judged), failure_keys(judged))
            self.shrink_start = time.perf_counter()
        elif not same_symptom(judged, *self.target):
            self.stash.setdefault(check_key(judged), judged)
            return False
        return True

    def _count_drawn(self) -> None:
        self.drawn += 1
        drawn_counts[self.impl.name] += 1

    def judge_first(self, cases) -> None:
        """Cases judged before any draw, saved unshrunk when they fail (the load probe's)."""
        for case in cases:
            try:
                check_case(self.impl, case, save_to_file=self.save_to_file,
                           regressions_dir=self.regressions_dir, device=self.device,
                           judge_fn=self.judge_fn)
            except Refused as exc:
                if not self.pruned.record(case, str(exc)):
                    self.refused[str(exc)] += 1
            except Counterexample as found:
                self.judged += 1
                if self.book.owner(found.judged) is None:
                    self.first = self.first or self.judged
                    record(self.book, found, self.variant_judge, shrunk=False,
                           found_at=self.judged)
            else:
                self.judged += 1
            self._count_drawn()

    def run(self) -> Campaign:
        base = hypothesis_internals.settings_of(self.test)
        for round_number in itertools.count():
            # Each round draws anew (its own seed) with the budget left, and shrinks the first
            # failure that no defect found so far explains; known ones are tallied and pass.
            if (self.stop_at_first and self.book.defects or self.drawn >= self.limit
                    or self.over_budget()):
                break
            self.target, self.forward_failed, self.raised, self.cut = None, False, False, False
            # Later rounds skip the database's replay: it deletes every saved failure that does
            # not fail again, and the ones found so far now pass, tallied.
            later = {"phases": [p for p in base.phases if p != Phase.reuse]} if round_number else {}
            if round_number and self.seed is None:
                later["derandomize"] = False
            drawn_before, end = self.drawn, self._turn_end()
            hypothesis_internals.use_settings(self.test, settings(
                base, max_examples=end - self.drawn, **later))
            if round_number:
                hypothesis_internals.use_seed(self.test, (self.seed or 0) + round_number)
            try:
                self.test()
            except _TimeIsUp:
                return self.finished(budget_hit=True)
            except Counterexample as found:
                defect = record(self.book, found, self.variant_judge, found_at=self.judged)
                if self.cut and defect.counterexample is found:
                    defect.shrink_note = "cut short"     # finish_shrinks goes on from it
            except FlakyFailure as exc:
                # judge_once makes every case's verdict stable, so this means the strategy or
                # the harness changed between Hypothesis's runs: reported, never an internal error.
                return self.finished(error=f"FlakyFailure: {' '.join(str(exc).split())[:300]}")
            except HypothesisException as exc:
                return self.finished(
                    error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
            else:
                # A round without a new defect: its budget is spent, unless only its palette's
                # turn ended (or it drew short of it: the same turn again, with another seed).
                if self.rotation is None or self.drawn == drawn_before or self.drawn >= self.limit:
                    break
        return self.finished()

    def _turn_end(self) -> int:
        """How many drawn cases the next round may reach: the budget's, or for a rotating
        campaign the end of the palette's turn it is in (which it moves on to here)."""
        if self.rotation is None:
            return self.limit
        turn = self.rotation.rotation.turn(self.drawn)
        until = None if self.seconds is None else self.start + self.seconds
        self.rotation.begin(turn, last=(turn + 1) * self.rotation.rotation.every >= self.limit,
                            until=until)
        return min(self.limit, self.rotation.turn_end())

    def finished(self, **kw) -> Campaign:
        book = self.book
        report_stashed(book, self.stash, self.variant_judge, self.save_to_file,
                       self.regressions_dir, self.judged)
        fold_mixtures(book)
        if self.shrink:
            finish_shrinks(book, self.variant_judge, self.save_to_file, self.regressions_dir,
                           seconds=None if self.seconds is None
                           else FINISH_SHRINK_SHARE * self.seconds)
        kw.setdefault("budget_hit", self.over)
        kw.setdefault("ended", "time" if self.over else "first failure" if self.stop_at_first
                      and book.defects else "cases" if self.drawn >= self.limit else "exhausted")
        return Campaign(cases=self.judged, seconds=time.perf_counter() - self.start,
                        refused=dict(self.refused), forward_only=dict(self.forward_only),
                        impl=self.impl.name, **kw,
                        counterexample=book.defects[0].counterexample if book.defects else None,
                        cases_to_first_failure=self.first if book.defects else None,
                        defects=list(book.defects), pruned=self.pruned.report())
