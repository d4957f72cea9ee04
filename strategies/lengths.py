"""Sequence lengths and head dims, biased toward the sizes that break tiled kernels."""
from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

TILE = 16   # the tile edge of the kernels in this repo; tile-1, tile, tile+1 are drawn often

# Ordered so that shrinking (toward the first entry) moves toward the simplest size.
POW2_HEAD_DIMS = (16, 32, 64, 128)
ODD_HEAD_DIMS = (24, 40, 80, 96, 8, 48, 72, 1, 3)


def _interesting_lengths(tile: int, max_len: int, min_len: int) -> list[int]:
    # 0 right after 1: drawn as often as any other edge size, and shrinking still prefers 1
    candidates = [1, 0, 2, 3, 5, tile - 1, tile, tile + 1, 7, 13, 2 * tile, 2 * tile + 1,
                  3 * tile - 1, 31, 37, 4 * tile]
    seen, out = set(), []
    for n in candidates:
        if min_len <= n <= max_len and n not in seen:
            seen.add(n)
            out.append(n)
    return out


def seq_lens(*, min_len: int = 1, max_len: int = 40, max_large_len: int | None = None,
             tile: int = TILE, allow_zero: bool = False) -> st.SearchStrategy[int]:
    """Lengths near the tile edges and small primes first, any length up to max_len, and now and
    then a longer one up to max_large_len."""
    if min_len < 0:
        raise InvalidArgument(f"min_len={min_len} must be non-negative")
    if min_len > max_len:
        raise InvalidArgument(f"min_len={min_len} is larger than max_len={max_len}")
    if max_large_len is not None and max_large_len < max_len:
        raise InvalidArgument(f"max_large_len={max_large_len} is smaller than max_len={max_len}")
    if tile < 1:
        raise InvalidArgument(f"tile={tile} must be at least 1")
    lo = min_len if allow_zero else max(min_len, 1)
    branches = [st.sampled_from(_interesting_lengths(tile, max_len, lo)),
                st.integers(max(lo, 1), max_len)]
    if max_large_len is not None and max_large_len > max_len:
        branches.append(st.integers(max_len + 1, max_large_len))
    return st.one_of(branches)


def head_dims(declared, *, max_head_dim: int = 256) -> st.SearchStrategy[int]:
    """Declared head dims (a set), or for `None` (any) powers of two first, then odd sizes."""
    if declared is not None:
        dims = sorted(declared, key=lambda d: (d not in POW2_HEAD_DIMS, d))
        if not dims:
            raise InvalidArgument("declared=set() leaves no head dim to draw")
        return st.sampled_from(dims)
    dims = [d for d in POW2_HEAD_DIMS + ODD_HEAD_DIMS if d <= max_head_dim]
    if not dims:
        raise InvalidArgument(f"max_head_dim={max_head_dim} leaves no head dim to draw")
    return st.sampled_from(dims)
