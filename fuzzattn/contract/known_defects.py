"""Known upstream defects: input classes on which a third-party implementation is known to fail.

Fuzzing a real library finds its real defects, and then finds them again in every campaign:
the H200 campaigns of SDPA's backends stopped within a few cases on the same two or three
upstream bugs, and a device fault (which poisons the CUDA context of the process judging it)
took the rest of an in-process run down with it. Once such a defect is understood it is pinned
by a regression file whose `expected_failures` entry names it (its replay still reports XFAIL,
and XPASS when upstream fixes it), and declared here as the class of cases it shows on:

    KnownDefect(name, device_type, applies, regression, backward=False)

Campaigns (`campaigns.campaign.judge_once`) and the metamorphic relations do not judge a case a
declared defect applies to: like a declared refusal it is counted and reported ("known upstream
defect ..."), never a pass, and Hypothesis draws another case, so the search goes on past the
known bug instead of shrinking it once more. A replay of a regression file judges it whatever
is declared here. Keep each predicate as narrow as the `fuzzattn explain` evidence in its file:
whatever it covers is no longer fuzzed on that device.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from fuzzattn.contract.case import AttentionCase


KNOWN_PREFIX = "known upstream defect"      # how a passed-over draw is counted and reported


@dataclasses.dataclass(frozen=True)
class KnownDefect:
    name: str                                   # one line: what fails, on which inputs
    device_type: str                            # "cuda" or "cpu": where it was measured
    applies: Callable[[AttentionCase], bool] = dataclasses.field(compare=False)
    regression: str = ""                        # the file under regressions/ that pins it
    backward: bool = False                      # shows only when gradients are judged

    def covers(self, case: AttentionCase, device_type: str, gradients: bool) -> bool:
        return (device_type == self.device_type and (gradients or not self.backward)
                and self.applies(case))

    def summary(self) -> str:
        """How a campaign reports the draws it passed over."""
        return f"{KNOWN_PREFIX} ({self.regression}): {self.name}"


def known_defect(defects, case: AttentionCase, device, gradients: bool) -> KnownDefect | None:
    """The first of `defects` that covers this case on `device` (a torch.device or its name, as
    "cuda:0"), or None. Most implementations declare none: then nothing is computed."""
    if not defects:
        return None
    device_type = torch.device(device).type
    for defect in defects:
        if defect.covers(case, device_type, gradients):
            return defect
    return None
