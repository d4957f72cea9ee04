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


# Shape families: the (Nq, Nk) pairs real workloads run, drawn on purpose rather than left to two
# independent draws (which need 60-160 cases to produce, say, Nq = 1 with Nk > 1 under a causal
# mask, or Nq > Nk under bottom-right alignment). Ordered simplest first: Hypothesis shrinks a
# one_of toward its first branch.
SHAPE_FAMILIES = ("independent", "decode", "square", "chunk", "tall", "multi_block", "tile_edges")
MAX_CHUNK = 16      # speculative decoding: a few new queries against a long cache (half the chunks)
# Families drawn twice as often as the others. Hypothesis spends most of a 60-case campaign
# mutating a dozen or so fresh draws, so a family's share of fresh draws decides how soon it is
# seen: tall (bottom-right empty rows, otherwise seen late in a short campaign) and multi_block
# (where accumulator precision bugs show; the only family besides chunk and decode that always
# spans several key tiles), and decode (drawn causal, its alignment shows only top-left: at a
# single weight a top-left decode is one draw in twenty, too rare for a 60-case gpu campaign to
# find a decode path that drops the mask). Square shapes also come from the independent and
# tile-edge families.
EXTRA_WEIGHT = ("tall", "multi_block", "decode")


def seq_shapes(*, max_len: int = 40, max_large_len: int | None = None, tile: int = TILE,
               allow_zero: bool = False) -> st.SearchStrategy[tuple[str, int, int]]:
    """(family, Nq, Nk), one family per draw (EXTRA_WEIGHT ones twice as likely as the rest):

    independent  Nq and Nk drawn independently by seq_lens (the draw that finds the odd pairs)
    decode       Nq = 1 against Nk from 1 up to the longest length (half the time several key
                 tiles): one new token against a KV cache
    square       Nq = Nk: prefill, where causal top-left and bottom-right coincide
    chunk        2 <= Nq <= 16, or half the time a chunk of several query tiles (tile < Nq <=
                 top / 2), with Nk >= 2 Nq and more than one key tile when the limits allow:
                 speculative decoding and chunked prefill, where causal alignment decides all
    tall         Nq > Nk >= 1: bottom-right alignment leaves the first Nq - Nk rows with no
                 visible key beside rows that have some, the empty-row convention's main source
    multi_block  Nk > tile (two key tiles or more) against any Nq, half the time Nq > tile too:
                 where a tiled kernel's online softmax rescales and its accumulator is carried,
                 and rounded, across tiles, and a backward's loops over both run several blocks
    tile_edges   Nq and Nk each one of the tile-boundary sizes (tile - 1, tile, tile + 1, ...)

    The decode, chunk and multi_block families put most draws past one key tile because that is
    where precision bugs of the running state compound (one rounding per tile carried).
    """
    lengths = seq_lens(max_len=max_len, max_large_len=max_large_len, tile=tile,
                       allow_zero=allow_zero)
    top = max_large_len if max_large_len is not None else max_len
    positive = seq_lens(min_len=1, max_len=max_len, max_large_len=max_large_len, tile=tile)
    branches = {"independent": st.tuples(st.just("independent"), lengths, lengths)}
    # Key lengths spanning several tiles, when the limits allow any.
    several = st.integers(tile + 1, top) if top > tile else None
    decode_keys = st.one_of(positive, several) if several is not None else positive
    branches["decode"] = decode_keys.map(lambda n: ("decode", 1, n))
    branches["square"] = positive.map(lambda n: ("square", n, n))
    if top >= 4:
        def chunk_keys(nq: int):
            lo = 2 * nq
            return st.integers(max(lo, tile + 1) if top > max(lo, tile) else lo, top)
        queries = st.integers(2, min(MAX_CHUNK, top // 2))
        if top // 2 > tile:                # half the time a chunk of several query tiles
            queries = st.one_of(queries, st.integers(tile + 1, top // 2))
        branches["chunk"] = queries.flatmap(
            lambda nq: chunk_keys(nq).map(lambda nk: ("chunk", nq, nk)))
    if top >= 2:
        # Nk >= 1: rows with keys next to rows without, the mix a kernel must keep apart (with
        # Nk = 0 every row is empty and a tiled kernel never enters its key loop, so a bug in the
        # loop's handling of empty rows cannot show). Nk = 0 comes from the independent family.
        branches["tall"] = st.integers(1, top - 1).flatmap(
            lambda nk: st.integers(nk + 1, top).map(lambda nq: ("tall", nq, nk)))
    if several is not None:
        branches["multi_block"] = st.tuples(st.just("multi_block"), st.one_of(positive, several),
                                            several)
    edges = _edges(tile, top, 1)
    if edges:
        branches["tile_edges"] = st.tuples(st.just("tile_edges"), st.sampled_from(edges),
                                           st.sampled_from(edges))
    # One entry per unit of weight, the families' order first: sampled_from shrinks toward the
    # first entry, so a failure still shrinks toward the independent family.
    draws = [f for f in SHAPE_FAMILIES if f in branches]
    draws += [f for f in EXTRA_WEIGHT if f in branches]
    return st.sampled_from(draws).flatmap(branches.__getitem__)


def head_dim_choices(declared, *, max_head_dim: int = 256) -> list[int]:
    """Declared head dims (a set), or for `None` (any) powers of two first, then odd sizes."""
    if declared is not None:
        dims = sorted(declared, key=lambda d: (d not in POW2_HEAD_DIMS, d))
        if not dims:
            raise InvalidArgument("declared=set() leaves no head dim to draw")
        return dims
    dims = [d for d in POW2_HEAD_DIMS + ODD_HEAD_DIMS if d <= max_head_dim]
    if not dims:
        raise InvalidArgument(f"max_head_dim={max_head_dim} leaves no head dim to draw")
    return dims


def head_dims(declared, *, max_head_dim: int = 256) -> st.SearchStrategy[int]:
    """A head dim of `head_dim_choices`, shrinking toward the first."""
    return st.sampled_from(head_dim_choices(declared, max_head_dim=max_head_dim))
