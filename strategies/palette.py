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
first, so a palette draws plain cases and one combination, taken in turn (`in_turn`). The head
dims come from one group the kernel builds the same binaries for (`head_dim_subset`), with no
first choice kept: shrinking moves toward the group's first dim. Everything else stays free:
lengths, batch, heads, values, scale, data seed. A long campaign moves on to other palettes
(fuzzattn/campaigns/rotation.py), so what one palette leaves out (a head dim past 32, a Q load
past D) comes over its turns.
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


def in_turn(choices: Sequence[T], palette: int) -> list[T]:
    """The first of `choices` and one other, taken in turn: palette n takes other n mod
    (len - 1), so consecutive palettes (a campaign's turns, or its shards side by side) meet
    every other choice within len - 1 of them. For the variant combinations: a random pick left
    a 100-case campaign's four palettes without a window, which its window bug needed."""
    if len(choices) <= CHOICES_PER_AXIS:
        return list(choices)
    return [choices[0], choices[1 + palette % (len(choices) - 1)]]


def dim_class(head_dim: int) -> int:
    """The head dim a tiled kernel pads `head_dim` to: a power of two of at least 16, what
    `tl.dot` wants (a compiled kernel's BLOCK_D constexpr: one set of binaries per class)."""
    return max(16, 1 << max(head_dim - 1, 0).bit_length())


# Row strides of a head dim divisible by this many elements share Triton's specialisation class
# of integer arguments (divisible by 16); the others fall in another.
ALIGNED = 16


def head_dim_subset(dims: Sequence[int], palette: int) -> list[int]:
    """The head dims of `dims` a palette draws, in their order: one group of dims a compiled
    kernel builds the same binaries for, chosen by the palette. A group is a class (BLOCK_D)
    and, within it, the dims whose row strides are divisible by ALIGNED, or the others: Triton
    specialises on the head dim through both (HEAD_DIM itself is not specialised), so each group
    is one set of binaries of every kernel and a palette holds one. Dims below their class's
    width (a mask past D reads padding) are in every group but the aligned ones of 16 and 32;
    the groups come over a rotation's palettes (fuzzattn/campaigns/rotation.py)."""
    groups: dict[tuple[int, bool], list[int]] = {}
    for d in dims:
        groups.setdefault((dim_class(d), d % ALIGNED == 0), []).append(d)
    order = sorted(groups, reverse=True)           # widest class first, aligned first
    chosen = order[random.Random(f"head_dim:{palette}").randrange(len(order))]
    return [d for d in dims if d in groups[chosen]]
