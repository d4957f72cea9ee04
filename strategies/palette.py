"""Compile palettes: small, numbered subsets of the axes that decide a compiled kernel's variants.

Compiled Triton builds one binary per variant: the constexpr values (tile sizes, BLOCK_D), the
launch options, the dtypes, and a class of every integer and pointer argument (1, divisible by
16, other). Drawn independently, the layouts and the configuration (with the specialisation
classes they bring) make almost every case a new variant: counted by
benchmarks/compile_variants.py on the gpu profile, triton_fa2 needed a new forward binary on
~35-45 cases in 100 and ~60 new backward binaries per 100 cases, each a compile of 0.2-1 s, so a
campaign spent its time in ptxas.

A campaign with palette n draws its layouts (the q, k, v triple) and its configuration from a
subset of the declaration: the axis's first choice (what shrinking moves toward, so a shrunk case
stays as simple as before) plus CHOICES_PER_AXIS - 1 others picked by n. Campaigns with other
palette numbers (the shards of a run) see other subsets. Everything else stays free: lengths,
batch, heads, values, scale, data seed, and the head dim. Head dims were narrowed too at first;
the mutant zoo with palettes forced on (FUZZATTN_PALETTE=on, the CPU) then let two head-dim bugs
survive (a Q load past D, a truncated head dim: 45/47 killed), so they are drawn from everything.
"""
from __future__ import annotations

import random
from typing import Sequence, TypeVar

T = TypeVar("T")

# Choices per axis in one palette, the first choice included. Measured with
# benchmarks/compile_variants.py (see benchmarks/THROUGHPUT.md).
CHOICES_PER_AXIS = 2


def subset(choices: Sequence[T], palette: int, axis: str) -> list[T]:
    """The first of `choices`, then CHOICES_PER_AXIS - 1 others chosen by (palette, axis).

    Deterministic: the same palette number gives the same subset on every machine (a string
    seed hashes with SHA-512 in `random.Random`, not with Python's salted hash)."""
    if len(choices) <= CHOICES_PER_AXIS:
        return list(choices)
    others = random.Random(f"{axis}:{palette}").sample(range(1, len(choices)), CHOICES_PER_AXIS - 1)
    return [choices[0]] + [choices[i] for i in sorted(others)]

