"""Known upstream defects: input classes on which a third-party implementation is known to fail.

Fuzzing a real library finds its real defects, and then finds them again in every campaign:
GPU campaigns of SDPA's backends stopped within a few cases on the same two or three
upstream bugs, and a device fault (which poisons the CUDA context of the process judging it)
took the rest of an in-process run down with it. Once such a defect is understood it is pinned
by a regression file whose `expected_failures` entry names it (its replay still reports XFAIL,
and XPASS when upstream fixes it), and declared here as the class of cases it shows on:

    KnownDefect(name, device_type, applies, regression, backward=False, check="out")

Campaigns (`campaigns.campaign.judge_once`) still run and judge a case a declared defect applies
to, when the defect names the `check` its file records: a case that passes is a pass; one whose
failed checks include that check is the known defect's, tallied to it ("known upstream defect
... hit", counted as a refusal is, never a pass and never shrunk again); any other failure on
that case is a finding like any. A defect that names no check, or whose check is a process
verdict (a device fault poisons the CUDA context of the process judging it) outside an isolated
judge, is passed over unjudged: counted ("known upstream defect ..."), and Hypothesis draws
another case. So is, outside an isolated judge, a defect declared `unsafe`: one whose failure
leaves the judging process unfit to go on (a kernel touching memory it does not own, after which
no later result of that process can be trusted); every replay judges its file in a worker process. When every
such defect covering a case is a backward one, only its gradients are passed over: the forward
is judged, and the case counted as judged without gradients. The metamorphic relations pass
over every covered case. A replay of a regression file judges it whatever is declared here. Keep
each predicate as narrow as the `fuzzattn explain` evidence in its file.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from fuzzattn.contract.case import AttentionCase


KNOWN_PREFIX = "known upstream defect"      # how a passed-over draw is counted and reported
KNOWN_HIT = "hit"                           # ... and a judged draw that failed as the defect
# Verdicts of a process that hung, died or faulted the device (judging.verdict.PROCESS_CHECKS,
# restated: the contract imports nothing above it)
_PROCESS_CHECKS = ("device_fault", "segfault", "hang")


@dataclasses.dataclass(frozen=True)
class KnownDefect:
    name: str                                   # one line: what fails, on which inputs
    device_type: str                            # "cuda" or "cpu": where it was measured
    applies: Callable[[AttentionCase], bool] = dataclasses.field(compare=False)
    regression: str = ""                        # the file under regressions/ that pins it
    backward: bool = False                      # shows only when gradients are judged
    check: str = ""                             # the check its file records ("": not judged)
    unsafe: bool = False                        # judged in a worker process only (docstring)

    def covers(self, case: AttentionCase, device_type: str, gradients: bool) -> bool:
        return (device_type == self.device_type and (gradients or not self.backward)
                and self.applies(case))

    def summary(self) -> str:
        """How a campaign reports the draws it passed over."""
        return f"{KNOWN_PREFIX} ({self.regression}): {self.name}"

    def judged(self, isolated: bool) -> bool:
        """Whether a covered case is run and judged (module docstring)."""
        return bool(self.check) and (isolated or (self.check not in _PROCESS_CHECKS
                                                  and not self.unsafe))

    def matches(self, judged) -> bool:
        """Whether a judgement of a covered case failed the way the defect's file records."""
        return bool(self.check) and any(v.check == self.check for v in judged.failures)

    def tally(self) -> str:
        """How a campaign reports a judged case that failed as this defect."""
        return f"{KNOWN_PREFIX} {KNOWN_HIT} ({self.regression}): {self.name}"


# How a draw a campaign counted without a verdict of its own is reported: refused (a declared
# error), judged and failing as a known defect (a hit), or passed over unjudged.
REFUSED, HIT, PASSED_OVER = "refused", "judged, failing as known upstream defects", "passed over"


def kind(summary: str) -> str:
    """REFUSED, HIT or PASSED_OVER, by the draw's counted summary."""
    if not summary.startswith(KNOWN_PREFIX):
        return REFUSED
    return HIT if summary.startswith(f"{KNOWN_PREFIX} {KNOWN_HIT} ") else PASSED_OVER


def covering(defects, case: AttentionCase, device, gradients: bool) -> list[KnownDefect]:
    """Every one of `defects` that covers this case on `device` (a torch.device or its name, as
    "cuda:0"). Most implementations declare none: then nothing is computed."""
    if not defects:
        return []
    device_type = torch.device(device).type
    return [defect for defect in defects if defect.covers(case, device_type, gradients)]
