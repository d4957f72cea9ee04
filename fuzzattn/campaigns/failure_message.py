"""The message of a failing `check_case`: what a test runner shows of a counterexample.

Its first line names the implementation, the check and the case, with the error and the bound
it broke, since a runner's one-line summary of a failure (pytest's `-r` lines) shows only that
line. Then every failed check, the map of bad query rows, the regression file and the command
that replays it. The case's repr (a constructor call to paste into `@example`) is left out
inside a Hypothesis test, whose own report prints the same call as the falsifying example.
"""
from __future__ import annotations

from hypothesis import currently_in_test_context

from fuzzattn.campaigns import regression_file


def failure_message(judged, written: regression_file.Written | None) -> str:
    """The message of the Counterexample raised for `judged`, whose file is `written`."""
    first = judged.first_failure
    lines = [first.summary() if first is not None else f"{judged.impl}: failed on {judged.case}",
             judged.describe(case=False)]
    if not currently_in_test_context():
        lines.append(f"  repr: {judged.case!r}")
    if written is not None:
        lines.append(f"  regression file: {regression_file.display_path(written.path)}"
                     + (f" (fallback: {written.fallback_reason})" if written.fallback_reason else ""))
        lines.append(f"  replay:  {regression_file.replay_command(written.path, judged.cli_name)}")
    return "\n".join(lines)
