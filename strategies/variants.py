"""Attention variants: sliding windows, softcaps, ALiBi and paged KV caches, drawn only for
implementations declaring them.

Each is off in about half the draws and shrinks toward off (-1, -1 / 0.0 / "" / 0), so a failure
that needs no variant is reported without one.
"""
from __future__ import annotations

import functools

from hypothesis import strategies as st

from fuzzattn.contract.alibi import FAMILIES, STANDARD
from fuzzattn.contract.case import NO_WINDOW

# Caps near the scores' own range (normal q, k give |scale q.k| of a few units), where tanh bends
# them, out to one past which it is nearly the identity.
SOFTCAPS = (1.0, 2.0, 5.0, 50.0)


def window_bounds(seq_q: int, seq_k: int) -> st.SearchStrategy[int]:
    """One side of a window: unbounded, small, the lengths' edges (where a row keeps exactly its
    last or first key), or anything up to past both sequences."""
    edges = sorted({0, 1, 2, max(seq_q - 1, 0), seq_q, max(seq_k - 1, 0), seq_k,
                    abs(seq_k - seq_q), seq_q + seq_k})
    return st.one_of(st.just(-1), st.sampled_from(edges), st.integers(0, seq_q + seq_k + 2))


@functools.lru_cache(maxsize=1024)     # built per drawn case: once per pair of lengths instead
def windows(seq_q: int, seq_k: int) -> st.SearchStrategy[tuple[int, int]]:
    """(left, right): (-1, -1) (no window) in about half the draws, else each side drawn alone."""
    side = window_bounds(seq_q, seq_k)
    return st.one_of(st.just(NO_WINDOW),
                     st.tuples(side, side).filter(lambda w: w != NO_WINDOW))


def softcaps() -> st.SearchStrategy[float]:
    """0.0 (off) in about half the draws, else a cap from the scores' range out to 50."""
    # Mapped, so one_of does not flatten the two into three equal branches with the off one.
    on = st.one_of(st.sampled_from(SOFTCAPS), st.floats(1.0, 50.0)).map(float)
    return st.one_of(st.just(0.0), on)


def alibis() -> st.SearchStrategy[str]:
    """"" (off) in about half the draws, else a slope family: the standard slopes first (what a
    failure shrinks to), then ones that make far keys vanish and ones near rounding."""
    families = [STANDARD] + [f for f in FAMILIES if f != STANDARD]
    return st.one_of(st.just(""), st.sampled_from(families))


# Block sizes: one row a block (every key its own page), small odd and even ones whose last block
# is partly filled at most lengths, and vLLM's 16.
PAGE_SIZES = (1, 2, 3, 4, 8, 16)


def page_sizes() -> st.SearchStrategy[int]:
    """0 (dense k, v) in about half the draws, else a paged cache's block size."""
    return st.one_of(st.just(0), st.sampled_from(PAGE_SIZES))
