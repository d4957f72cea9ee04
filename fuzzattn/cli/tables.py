"""How the CLI shows what it did: plain-text tables, a markdown summary, JUnit XML, and progress.

Everything the CLI runs (a regression file replayed on an implementation, a fuzzing campaign, a
mutant self-test) ends as one `fuzzattn.campaigns.outcome.Outcome`; the renderers here only read
outcomes, so the terminal table, the CI step summary and the JUnit file always agree. Failures
come first wherever a reader scans from the top.

Progress is shown only when stdout is a terminal and CI is not set: it is a single line per
campaign, rewritten with carriage returns, so logs stay clean everywhere else. `campaign.fuzz`
has no progress hook, so the count comes from a `.map()` on the strategy: Hypothesis calls it
once per drawn case (shrinking included) and it consumes no randomness, so the cases drawn are
the same with or without progress.
"""
from __future__ import annotations

import os
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterable, Sequence

from fuzzattn.campaigns.outcome import ERROR, OK, XFAIL, Outcome


# -- plain-text tables ------------------------------------------------------------------------
def _cell(value, width: int) -> str:
    text = "" if value is None else str(value)
    text = " ".join(text.split())          # a table row is one line, whatever the cell held
    return text if len(text) <= width else text[:width - 3] + "..."


def table(headers: Sequence[str], rows: Iterable[Sequence], *, max_width: int = 72) -> str:
    """A left-aligned fixed-width table; cells longer than `max_width` are cut with '...'."""
    body = [[_cell(v, max_width) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in body]
    return "\n".join(out)


def seconds(value: float | None) -> str:
    """A table's seconds cell."""
    return "" if value is None else f"{value:.1f}"


def seconds_text(seconds: float) -> str:
    """A time cap in a sentence: 5.26, 60, 3600 (not 5.26341 or 3.6e+03)."""
    if seconds < 0.01:
        return f"{seconds:g}"
    return f"{seconds:.2f}".rstrip("0").rstrip(".")


def outcome_rows(outcomes: Sequence[Outcome]) -> list[list]:
    return [[o.stage, o.subject, o.verdict, "" if o.cases is None else o.cases,
             seconds(o.seconds), o.detail] for o in outcomes]


OUTCOME_HEADERS = ("stage", "subject", "verdict", "cases", "seconds", "detail")


def summary_table(outcomes: Sequence[Outcome]) -> str:
    return table(OUTCOME_HEADERS, outcome_rows(outcomes))


def gate_table(outcomes: Sequence[Outcome], *, verbose: bool = False) -> str:
    """The gate's table: every outcome but the regression files that replayed clean, which are
    one line per implementation after it (hundreds of 'ok' rows would bury what needs eyes:
    failures, expected failures, skips); `verbose`: every row."""
    if verbose:
        return summary_table(outcomes)
    shown, clean = [], {}
    for o in outcomes:
        if o.stage == "replay" and o.verdict == OK:
            impl = o.subject.partition(" on ")[2] or "-"
            clean[impl] = clean.get(impl, 0) + 1
        else:
            shown.append(o)
    lines = [f"{impl}: {n} file{'s' if n != 1 else ''} replayed clean" for impl, n in clean.items()]
    return "\n".join([summary_table(shown)] + lines)


def failure_details(outcomes: Sequence[Outcome]) -> str:
    """The full message of every failed outcome, each under a header naming it."""
    blocks = []
    for o in outcomes:
        if not o.passed and o.message:
            blocks.append(f"--- {o.stage}: {o.subject} ({o.verdict})\n{o.message}")
    return "\n\n".join(blocks)


def defects_table(outcomes: Sequence[Outcome]) -> str:
    """Every distinct defect of the campaigns that found any, with the cases that hit it, what
    it needs (the factors whose plain choice makes it pass) and its file; '' when none did."""
    rows = []
    for o in outcomes:
        for i, d in enumerate(getattr(o.campaign, "defects", None) or [], 1):
            written = d.counterexample.written
            rows.append([o.subject, i, ", ".join(d.checks) or d.check_key, d.hits, d.needs(),
                         str(d.judged.case) + _shrink_mark(d),
                         written.path.name if written is not None else ""])
    if not rows:
        return ""
    return ("defects by cause (each once; checks = what its cases failed first; cases hit = drawn "
            "cases it explains):\n" + table(
                ("campaign", "#", "checks", "cases hit", "needs", "case", "file"), rows,
                max_width=60))


def _shrink_mark(defect) -> str:
    """' (shrink cut short)' or ' (not shrunk)' after a case its cause's shrink did not finish
    (the defect's failure text says how far it got)."""
    if defect.shrink_note:
        return " (shrink cut short)" if defect.shrunk else " (not shrunk)"
    return "" if defect.shrunk else " (not shrunk)"


def pruned_notes(outcomes: Sequence[Outcome]) -> list[str]:
    """'sq fp16 float16: BLOCK_M=64 BLOCK_N=64: CompileTimeAssertionFailure for D=32, 41 draws'
    per configuration a campaign pruned (it did not compile for those draws)."""
    from fuzzattn.campaigns.pruned import pruned_lines
    return [f"{o.subject}: {line}" for o in outcomes
            for line in pruned_lines(getattr(o.campaign, "pruned", None) or {})]


def counted_notes(outcomes: Sequence[Outcome]) -> list[str]:
    """Each campaign's draws counted without a verdict of their own, whole (the table's detail
    column cuts them): refused, tallied to or passed over for known upstream defects, judged
    without gradients."""
    return [f"{o.subject}: {note}" for o in outcomes
            if o.campaign is not None and (note := o.campaign.refusal_note())]


def after_campaigns(outcomes: Sequence[Outcome]) -> str:
    """What follows a campaign table: the defects table, the draws counted without a verdict,
    then the pruned configurations."""
    parts = [defects_table(outcomes)]
    counted = counted_notes(outcomes)
    if counted:
        parts.append("counted without a verdict of their own:\n"
                     + "\n".join("  " + n for n in counted))
    notes = pruned_notes(outcomes)
    if notes:
        parts.append("pruned (configurations that do not compile for these draws, as Triton's "
                     "autotuner would skip them):\n" + "\n".join("  " + n for n in notes))
    return "\n\n".join(p for p in parts if p)


def totals(outcomes: Sequence[Outcome]) -> str:
    failed = sum(not o.passed for o in outcomes)
    skipped = sum(o.skipped for o in outcomes)
    expected = sum(o.verdict == XFAIL for o in outcomes)
    passed = len(outcomes) - failed - skipped - expected
    return f"{passed} passed, {failed} failed, {skipped} skipped" + (
        f", {expected} expected failure(s)" if expected else "")


def failures_first(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """The same outcomes, failed ones first (stable otherwise)."""
    return sorted(outcomes, key=lambda o: o.passed)


# -- markdown (a CI step summary) ---------------------------------------------------------------
def _md_cell(value) -> str:
    text = " ".join(("" if value is None else str(value)).split())
    return text.replace("|", "\\|")


def markdown(outcomes: Sequence[Outcome], *, title: str = "fuzzattn gate", notes: Sequence[str] = ()) -> str:
    """A markdown summary: status line, the outcome table, then each failure in a code block."""
    failed = [o for o in outcomes if not o.passed]
    status = "FAILED" if failed else "passed"
    lines = [f"## {title}: {status}", "", f"{totals(outcomes)}.", ""]
    lines += [f"- {_md_cell(n)}" for n in notes]
    if notes:
        lines.append("")
    lines.append("| " + " | ".join(OUTCOME_HEADERS) + " |")
    lines.append("|" + "---|" * len(OUTCOME_HEADERS))
    for row in outcome_rows(failures_first(outcomes)):
        lines.append("| " + " | ".join(_md_cell(v) for v in row) + " |")
    if failed:
        lines += ["", "### Failures"]
        for o in failed:
            lines += ["", f"**{_md_cell(o.stage)}: {_md_cell(o.subject)}** ({o.verdict})", "",
                      "```", (o.message or o.detail).replace("```", "'''"), "```"]
    return "\n".join(lines) + "\n"


# -- JUnit XML ----------------------------------------------------------------------------------
def junit_xml(outcomes: Sequence[Outcome], *, name: str = "fuzzattn") -> str:
    """One <testsuite> per stage, one <testcase> per outcome; failures carry message and text."""
    root = ET.Element("testsuites", name=name)
    stages: dict[str, list[Outcome]] = {}
    for o in outcomes:
        stages.setdefault(o.stage, []).append(o)
    grand = dict(tests=0, failures=0, errors=0, skipped=0, time=0.0)
    for stage, items in stages.items():
        counts = dict(tests=len(items),
                      failures=sum(not o.passed and o.verdict != ERROR for o in items),
                      errors=sum(not o.passed and o.verdict == ERROR for o in items),
                      skipped=sum(o.skipped for o in items),
                      time=sum(o.seconds or 0.0 for o in items))
        suite = ET.SubElement(root, "testsuite", name=f"{name}.{stage}",
                              **{k: (f"{v:.3f}" if k == "time" else str(v)) for k, v in counts.items()})
        for k, v in counts.items():
            grand[k] += v
        for o in items:
            case = ET.SubElement(suite, "testcase", classname=f"{name}.{stage}", name=o.subject,
                                 time=f"{o.seconds or 0.0:.3f}")
            if o.skipped:
                ET.SubElement(case, "skipped", message=o.detail)
            elif not o.passed:
                tag = "error" if o.verdict == ERROR else "failure"
                node = ET.SubElement(case, tag, message=o.detail or o.verdict, type=o.verdict)
                node.text = o.message or o.detail
            if o.cases is not None:
                ET.SubElement(case, "system-out").text = f"{o.cases} cases judged"
    for k, v in grand.items():
        root.set(k, f"{v:.3f}" if k == "time" else str(v))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_text(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- progress -----------------------------------------------------------------------------------
LINE_EVERY = 10.0      # seconds between progress lines when the output is not a terminal


def progress_enabled(stream=None) -> bool:
    """A live line on a terminal (not under CI, whose logs keep every redraw)."""
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("CI")


class Progress:
    """What a campaign is doing while it runs: on a terminal one rewritten line,
    'fuzz sdpa float32  400/1000 cases  412 judged  37.5/s  3 refused  11.0/60 s', redrawn ten
    times a second; otherwise the same as a full line every LINE_EVERY seconds. Cases count
    draws, what --max-examples bounds; judged adds the shrinker's cases. A status ('replay 12/74
    FILE', 'starting 16 worker processes') is shown live, and elsewhere as a line when nothing
    was printed for LINE_EVERY seconds: a CI log of a gate replaying for minutes is not silent."""

    def __init__(self, enabled: bool | None = None, stream=None, every: float = LINE_EVERY):
        self.stream = stream or sys.stdout
        self.live = progress_enabled(self.stream) if enabled is None else enabled
        self.every = every
        self._width = 0
        self._quiet_since = time.perf_counter()

    def track(self, strategy, label: str, budget: int | None, *, cap: float | None = None,
              counts=None):
        """The same strategy, showing progress as each case is drawn. `counts()` gives (judged,
        refused or passed over, drawn) so far; without it, each draw counts as all three.
        `budget`: the cases to draw, None when only the time cap `cap` ends the campaign."""
        state = {"n": 0, "start": time.perf_counter(), "shown": 0.0}
        pause = 0.1 if self.live else self.every
        state["shown"] = 0.0 if self.live else state["start"]

        def count(case):
            state["n"] += 1
            now = time.perf_counter()
            if now - state["shown"] >= pause:
                state["shown"] = now
                self._show(self._line(label, budget, cap, now - state["start"], state["n"], counts))
            return case

        return strategy.map(count)

    @staticmethod
    def _line(label, budget, cap, elapsed, drawn, counts) -> str:
        judged, refused, drawn = counts() if counts is not None else (drawn, 0, drawn)
        rate = judged / elapsed if elapsed > 0 else 0.0
        limit = f"/{seconds_text(cap)}" if cap else ""
        # a probe's case judged before the draws, or a database replay, may pass the budget
        cases = f"{min(drawn, budget)}/{budget}" if budget else f"{drawn}"
        return (f"{label}  {cases} cases  {judged} judged  {rate:.1f}/s  {refused} refused  "
                f"{elapsed:.1f}{limit} s")

    def status(self, text: str) -> None:
        if self.live or time.perf_counter() - self._quiet_since >= self.every:
            self._show(text)

    def _show(self, text: str) -> None:
        if not self.live:
            self.stream.write(text + "\n")
            self.stream.flush()
            self._quiet_since = time.perf_counter()
            return
        pad = max(0, self._width - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        if self.live and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
