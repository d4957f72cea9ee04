"""Replay regression fixtures against implementations, with the input-drift check."""
from __future__ import annotations

import dataclasses

from .contract import Implementation
from .fixtures import Fixture, display_path
from .inputs import inputs_sha256, materialize
from .judge import Report, judge


@dataclasses.dataclass
class ReplayResult:
    fixture: Fixture
    impl: str
    passed: bool
    skipped: bool
    check: str          # the failing check, "inputs_drifted", or "" when it passed
    message: str
    report: Report | None = None    # None when the replay refused to run (drifted inputs)


def replay_one(fixture: Fixture, impl: Implementation, device=None) -> ReplayResult:
    """Judge `impl` on the fixture's case, refusing to run if the inputs are not the same bits."""
    case = fixture.case
    header = f"fixture {display_path(fixture.path) if fixture.path else case.key()}"
    if fixture.covers:
        header += f" (covers: {fixture.covers})"
    if fixture.inputs_sha256:
        actual = inputs_sha256(materialize(case, "cpu"))
        if actual != fixture.inputs_sha256:
            recorded = (fixture.versions or {}).get("torch", "unknown")
            return ReplayResult(fixture, impl.name, False, False, "inputs_drifted",
                                f"{header}: inputs drifted: the case now materialises sha256 "
                                f"{actual[:16]}..., the fixture pins {fixture.inputs_sha256[:16]}... "
                                f"(recorded with torch {recorded}); not replaying different inputs")
    report = judge(impl, case, device=device)
    if report.skipped:
        return ReplayResult(fixture, impl.name, False, True, "", f"{header}: {report.skipped}", report)
    if report.passed:
        return ReplayResult(fixture, impl.name, True, False, "", f"{header}: {impl.name} ok", report)
    return ReplayResult(fixture, impl.name, False, False, report.first_failure.check,
                        f"{header}\n{report.describe()}\n  replay:  {fixture.replay_command()}"
                        f" --impl {impl.name}", report)
