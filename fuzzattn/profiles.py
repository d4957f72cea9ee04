"""Run profiles: how many cases, and how large, for each place fuzzattn runs.

A profile is a Hypothesis settings profile of the same name plus the size limits the strategies
draw under. The active one is, in order: FUZZATTN_PROFILE if set; "ci" when the CI variable is
set (CI systems set it); "gpu" when CUDA is available; else "dev".

Hypothesis itself loads a built-in profile called "ci" when CI=true (derandomize=True,
database=None, deadline=None, print_blob=True). fuzzattn registers its own "ci" *on top of* that
one (parent=the built-in), so CI keeps Hypothesis's determinism and adds fuzzattn's budget and
size limits; the project's profile is then loaded explicitly, so nothing depends on import order.
"""
from __future__ import annotations

import dataclasses
import os

from hypothesis import HealthCheck, settings


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


PROFILES = {
    "ci": Profile("ci", max_examples=200, max_batch=2, max_kv_heads=2, max_group=2, max_seq=40,
                  max_large_seq=80, metamorphic_seq=64, derandomize=True,
                  description="deterministic, fits a 2-core CPU under Triton's interpreter"),
    "dev": Profile("dev", max_examples=100, max_batch=2, max_kv_heads=2, max_group=2, max_seq=40,
                   max_large_seq=80, metamorphic_seq=64,
                   description="random, quick feedback on a laptop CPU"),
    "gpu": Profile("gpu", max_examples=1000, max_batch=4, max_kv_heads=4, max_group=4, max_seq=300,
                   max_large_seq=1100, metamorphic_seq=2048,
                   description="compiled kernels: larger shapes, more cases"),
    "nightly": Profile("nightly", max_examples=5000, max_batch=4, max_kv_heads=4, max_group=4,
                       max_seq=300, max_large_seq=2100, metamorphic_seq=4096,
                       description="long exploration on a GPU"),
}


def register_hypothesis_profiles() -> None:
    # Slow interpreted kernels and float64 oracles: deadlines would only flake; shapes, not
    # data volume, are what we draw, so the too_slow/data_too_large checks do not apply.
    common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                        HealthCheck.data_too_large,
                                                        HealthCheck.filter_too_much])
    builtin_ci = settings.get_profile("ci")
    for p in PROFILES.values():
        parent = builtin_ci if p.name == "ci" else None
        kwargs = dict(common, max_examples=p.max_examples)
        if p.derandomize:
            kwargs.update(derandomize=True, database=None)
        settings.register_profile(p.name, parent=parent, **kwargs)


def active_name() -> str:
    name = os.environ.get("FUZZATTN_PROFILE")
    if name:
        if name not in PROFILES:
            raise ValueError(f"FUZZATTN_PROFILE={name!r} is not one of {sorted(PROFILES)}")
        return name
    if os.environ.get("CI"):
        return "ci"
    import torch
    return "gpu" if torch.cuda.is_available() else "dev"


def active() -> Profile:
    return PROFILES[active_name()]


def load(name: str | None = None) -> Profile:
    """Register every profile with Hypothesis and load `name` (default: the active one)."""
    name = name or active_name()
    if name not in PROFILES:
        raise ValueError(f"profile={name!r} is not one of {sorted(PROFILES)}")
    register_hypothesis_profiles()
    settings.load_profile(name)
    os.environ["FUZZATTN_PROFILE"] = name   # so strategies and xdist workers agree
    return PROFILES[name]
