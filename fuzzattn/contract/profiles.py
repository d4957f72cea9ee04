"""Run profiles: how many cases, and how large, for each place fuzzattn runs.

A profile is plain data: a case budget and the size limits strategies draw under. The Hypothesis
settings profile of the same name is registered and loaded by the run settings
(`fuzzattn.settings`), only in runs that use fuzzattn. The active profile is, in order:
FUZZATTN_PROFILE if set; "ci" when the CI variable is set (CI systems set it); "gpu" when CUDA
is available; else "dev".
"""
from __future__ import annotations

import dataclasses
import os


class ProfileError(ValueError):
    """A profile name that is not one of PROFILES."""


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    max_examples: int          # Hypothesis cases per differential test (one implementation, dtype)
    max_batch: int
    max_kv_heads: int
    max_group: int             # query heads per kv head (GQA/MQA), when declared
    max_seq: int               # usual upper bound for Nq and Nk
    max_large_seq: int         # now and then a longer sequence, up to this
    metamorphic_seq: int       # sequence length for oracle-free relations (float64 not needed)
    derandomize: bool = False
    description: str = ""
    # Cases of more multiply-adds than this (B * Hq * Nq * max(Nk, 1) * D) take their values
    # from the counter generator, computed on the device (fuzzattn/inputs/sources.py); None: every
    # case from the CPU's torch.Generator, as the CPU profiles keep (there the counter is ~5x
    # slower than randn). The GPU profiles give it to every case: inputs born on the device make
    # no transfer to it, and a case judged on the host reads them back with the runs' outputs,
    # so its one wait for a GPU time-sliced between fuzzers is that read-back.
    device_values_macs: int | None = None


PROFILES = {
    "ci": Profile("ci", max_examples=200, max_batch=2, max_kv_heads=2, max_group=2, max_seq=40,
                  max_large_seq=80, metamorphic_seq=64, derandomize=True,
                  description="deterministic, fits a 2-core CPU under Triton's interpreter"),
    "dev": Profile("dev", max_examples=100, max_batch=2, max_kv_heads=2, max_group=2, max_seq=40,
                   max_large_seq=80, metamorphic_seq=64,
                   description="random, quick feedback on a laptop CPU"),
    "gpu": Profile("gpu", max_examples=1000, max_batch=4, max_kv_heads=4, max_group=4, max_seq=300,
                   max_large_seq=1100, metamorphic_seq=2048, device_values_macs=0,
                   description="compiled kernels: larger shapes, more cases"),
    "nightly": Profile("nightly", max_examples=5000, max_batch=4, max_kv_heads=4, max_group=4,
                       max_seq=300, max_large_seq=2100, metamorphic_seq=4096,
                       device_values_macs=0, description="long exploration on a GPU"),
}


def active_name() -> str:
    name = os.environ.get("FUZZATTN_PROFILE")
    if name:
        if name not in PROFILES:
            raise ProfileError(f"FUZZATTN_PROFILE={name!r} is not one of {', '.join(sorted(PROFILES))}")
        return name
    if os.environ.get("CI"):
        return "ci"
    import torch
    return "gpu" if torch.cuda.is_available() else "dev"


def active() -> Profile:
    return PROFILES[active_name()]
