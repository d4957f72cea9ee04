"""Sequence lengths and head dims, biased toward the sizes that break tiled kernels."""
from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

TILE = 16   # the tile edge of the kernels in this repo; tile-1, tile, tile+1 are drawn often

# Ordered so that shrinking (toward the first entry) moves toward the simplest size.
POW2_HEAD_DIMS = (16, 32, 64, 128)
ODD_HEAD_DIMS = (24, 40, 80, 96, 8, 48, 72, 1, 3)


def _edges(tile: int, max_len: int, min_len: int) -> list[int]:
    """Sizes at tile boundaries, where ragged-tail and tile-skipping bugs live."""
    sizes = [tile, tile + 1, tile - 1, 2 * tile, 2 * tile + 1, 2 * tile - 1, 3 * tile, 4 * tile]
    return list(dict.fromkeys(n for n in sizes if min_len <= n <= max_len))


def _tiny(max_len: int, min_len: int, allow_zero: bool) -> list[int]:
    """1, then 0 (empty sequences), then small primes: 0 is drawn often, shrinking prefers 1."""
    return [n for n in (1, 0, 2, 3, 5, 7, 13)
            if (n == 0 and allow_zero) or min_len <= n <= max_len and n > 0]


def seq_lens(*, min_len: int = 1, max_len: int = 40, max_large_len: int | None = None,
             tile: int = TILE, allow_zero: bool = False) -> st.SearchStrategy[int]:
    """Tiny sizes and small primes, sizes at tile edges, any length up to max_len, and now and
    then a longer one up to max_large_len (each branch equally likely)."""
    if min_len < 0:
        raise InvalidArgument(f"min_len={min_len} must be non-negative")
    if min_len > max_len:
        raise InvalidArgument(f"min_len={min_len} is larger than max_len={max_len}")
    if max_large_len is not None and max_large_len < max_len:
        raise InvalidArgument(f"max_large_len={max_large_len} is smaller than max_len={max_len}")
    if tile < 1:
        raise InvalidArgument(f"tile={tile} must be at least 1")
    lo = max(min_len, 1)
    branches = [st.sampled_from(values) for values in (_tiny(max_len, lo, allow_zero),
                                                       _edges(tile, max_len, lo)) if values]
    if lo <= max_len:
        branches.append(st.integers(lo, max_len))
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
