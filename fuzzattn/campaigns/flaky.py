"""A reported failure judged again: if any rerun of the same case passes, it is `flaky`.

A kernel whose answer changes between calls on the same inputs (an autotuner's first call, a
race) would otherwise be reported by whichever verdict its first call happened to earn. The
`flaky` verdict goes first and says how many runs failed, and how the first one did.
"""
from __future__ import annotations

import dataclasses

from fuzzattn.judgement.judge import JudgedCase
from fuzzattn.judging.verdict import Verdict

FLAKY_RERUNS = 2          # extra judgements of a failing case; any pass makes it flaky


def flaky_or_consistent(case, run, judged: JudgedCase) -> JudgedCase:
    """`judged` if `run(case)` fails again every time, else `judged` led by a flaky verdict."""
    reruns = [run(case) for _ in range(FLAKY_RERUNS)]
    if all(not r.passed for r in reruns):
        return judged
    runs = 1 + len(reruns)
    failed = 1 + sum(not r.passed for r in reruns)
    first = judged.first_failure
    detail = (f"failed in {failed} of {runs} runs of the same case (first: {first.check}"
              + (f" error={first.error:.3g} allowed={first.allowed:.3g}"
                 if first.error is not None and first.allowed is not None else "")
              + (f": {first.detail}" if first.detail else "") + "); passed in the others")
    flaky = Verdict(impl=judged.impl, case=case, check="flaky", passed=False, detail=detail,
                    where=first.where, heatmap=first.heatmap)
    return dataclasses.replace(judged, verdicts=[flaky] + judged.verdicts)
