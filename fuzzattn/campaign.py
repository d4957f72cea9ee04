"""Fuzzing campaigns: judge drawn cases, turn the shrunk failure into a fixture.

`check_case` is what every Hypothesis test body calls. Hypothesis runs the minimal failing
example one last time with `is_final` set after shrinking; only that run writes a fixture, so
`regressions/` receives the shrunk case and never the intermediate ones.

`fuzz` runs a campaign outside pytest (the CLI's `fuzz`, `gate` and `mutants`), with a case
and/or time budget, and returns what it found.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from hypothesis import Phase, given, seed as hypothesis_seed, settings, strategies as st
from hypothesis.control import current_build_context, currently_in_test_context
from hypothesis.errors import HypothesisException

from . import fixtures
from .case import AttentionCase
from .contract import Implementation
from .inputs import inputs_sha256, materialize
from .judge import Report, judge


class Counterexample(AssertionError):
    """A case on which an implementation failed a check; carries the report and fixture path."""

    def __init__(self, report: Report, fixture_path: Path | None):
        self.report = report
        self.fixture_path = fixture_path
        lines = [report.describe()]
        if fixture_path is not None:
            fx = fixtures.Fixture(case=report.case, path=fixture_path)
            lines += [f"  fixture: {fixtures.display_path(fixture_path)}",
                      f"  replay:  {fx.replay_command()}"]
        super().__init__("\n".join(lines))


def _is_final_run() -> bool:
    if not currently_in_test_context():
        return True            # called directly (replay, a unit test): every failure is final
    return current_build_context().is_final


def save_fixture(report: Report, directory=None) -> Path:
    """Write the report's failure as a fixture (create-if-absent); returns its path."""
    case = report.case
    sha = inputs_sha256(materialize(case, "cpu"))
    path, _ = fixtures.write(fixtures.from_report(report, sha), directory)
    return path


def check_case(impl: Implementation, case: AttentionCase, *, save: bool = True,
               fixtures_dir=None, device=None) -> Report:
    """Judge one case; raise Counterexample on failure (writing a fixture on the final run)."""
    report = judge(impl, case, device=device)
    if report.skipped is not None:
        raise RuntimeError(f"{case} was drawn but cannot run: {report.skipped}")
    if not report.passed:
        path = save_fixture(report, fixtures_dir) if (save and _is_final_run()) else None
        raise Counterexample(report, path)
    return report


@dataclasses.dataclass
class CampaignResult:
    impl: str
    cases: int                          # cases judged, shrinking included
    seconds: float
    counterexample: Counterexample | None = None
    cases_to_first_failure: int | None = None
    error: str | None = None            # the campaign could not run (e.g. nothing drawable)
    budget_hit: bool = False            # the time cap stopped it before max_examples

    @property
    def passed(self) -> bool:
        return self.counterexample is None and self.error is None


def fuzz(impl: Implementation, strategy: st.SearchStrategy[AttentionCase], *, max_examples: int,
         seconds: float | None = None, seed: int | None = 0, save: bool = True, fixtures_dir=None,
         device=None, shrink: bool = True) -> CampaignResult:
    """Judge up to `max_examples` drawn cases, or until `seconds` pass, and shrink the first
    failure. Once the time cap is spent, draws are no longer judged: before a failure that ends
    the search; during shrinking it ends the shrink, and Hypothesis's final replay of the smallest
    failure found so far is still judged, reported and saved."""
    state = {"judged": 0, "first": None, "over": False}
    start = time.perf_counter()

    def over_budget() -> bool:
        state["over"] = state["over"] or (seconds is not None and time.perf_counter() - start > seconds)
        return state["over"]

    phases = None if shrink else [Phase.explicit, Phase.reuse, Phase.generate]

    @settings(max_examples=max_examples, database=None, deadline=None, derandomize=seed is None,
              print_blob=False, **({"phases": phases} if phases else {}))
    @given(strategy)
    def campaign(case):
        final = currently_in_test_context() and current_build_context().is_final
        if over_budget() and not final:
            # Unjudged draws pass: before a failure this ends the search; while shrinking, no
            # candidate can improve on the smallest failure so far, so the shrink winds down.
            return
        state["judged"] += 1
        try:
            check_case(impl, case, save=save, fixtures_dir=fixtures_dir, device=device)
        except Counterexample:
            if state["first"] is None:
                state["first"] = state["judged"]
            raise

    if seed is not None:
        campaign = hypothesis_seed(seed)(campaign)
    result = dict(impl=impl.name)
    try:
        campaign()
    except Counterexample as found:
        return CampaignResult(cases=state["judged"], seconds=time.perf_counter() - start,
                              counterexample=found, cases_to_first_failure=state["first"],
                              budget_hit=state["over"], **result)
    except HypothesisException as exc:
        return CampaignResult(cases=state["judged"], seconds=time.perf_counter() - start,
                              error=f"{type(exc).__name__}: {exc}", **result)
    return CampaignResult(cases=state["judged"], seconds=time.perf_counter() - start,
                          budget_hit=state["over"], **result)
