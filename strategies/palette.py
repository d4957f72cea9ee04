"""Compile palettes: small, numbered subsets of the axes that decide a compiled kernel's variants.

Compiled Triton builds one binary per variant: the constexpr values (tile sizes, BLOCK_D), the
launch options, the dtypes, and a class of every integer and pointer argument (1, divisible by
16, other). Drawn independently, the layouts and the configuration (with the specialisation
classes they bring) make almost every case a new variant, and a campaign spends its time
compiling.

A campaign with palette n draws its layouts (the q, k, v triple) and its configuration from a
subset of the declaration: the axis's first choice (what shrinking moves toward, so a shrunk case
stays as simple as before) plus CHOICES_PER_AXIS - 1 others picked by n. Campaigns with other
palette numbers (the shards of a run) see other subsets. The declared variants (window, softcap,
ALiBi, paged KV: flags a compiled kernel takes as constexprs) are one axis of combinations, none
first, so a palette draws plain cases and one combination. Everything else stays free: lengths,
batch, heads, values, scale, data seed, and the head dim (bugs that only some head dims show, a
Q load past D or a truncated head dim, need every head dim drawn).
"""
from __future__ import annotations

import random
from typing import Sequence, TypeVar

T = TypeVar("T")

# Choices per axis in one palette, the first choice included.
CHOICES_PER_AXIS = 2      # set with benchmarks/compile_variants.py


def subset(choices: Sequence[T], palette: int, axis: str) -> list[T]:
    """The first of `choices`, then CHOICES_PER_AXIS - 1 others chosen by (palette, axis).

    Deterministic: the same palette number gives the same subset on every machine (a string
    seed hashes with SHA-512 in `random.Random`, not with Python's salted hash)."""
    if len(choices) <= CHOICES_PER_AXIS:
        return list(choices)
    others = random.Random(f"{axis}:{palette}").sample(range(1, len(choices)), CHOICES_PER_AXIS - 1)
    return [choices[0]] + [choices[i] for i in sorted(others)]



def dim_class(head_dim: int) -> int:
    """The head dim a tiled kernel pads `head_dim` to: a power of two of at least 16, what
    `tl.dot` wants (a compiled kernel's BLOCK_D constexpr: one set of binaries per class)."""
    return max(16, 1 << max(head_dim - 1, 0).bit_length())


def head_dim_subset(dims: Sequence[int], palette: int) -> list[int]:
    """The head dims of `dims` a palette draws, in their order: those of the first dim's class
    and of CHOICES_PER_AXIS - 1 other classes (listed widest first: the widest holds the most
    head dims and the longest rows), and of each class its first dim (a power of two where the
    class has one) and CHOICES_PER_AXIS - 1 others. A dim below its class's width (a mask past D
    reads padding) stays in every class that has one; each dim of a class changes the strides'
    specialisation classes, so each is a variant of every kernel."""
    by_class: dict[int, list[int]] = {}
    for d in dims:
        by_class.setdefault(dim_class(d), []).append(d)
    first, *others = by_class
    classes = [first] + sorted(others, reverse=True)
    kept = {d for c in subset(classes, palette, "head_dim")
            for d in subset(by_class[c], palette, f"head_dim:{c}")}
    return [d for d in dims if d in kept]
