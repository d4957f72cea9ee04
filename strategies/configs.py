"""Configurations and length constraints: drawn inside what an implementation declares.

A configuration (tile sizes, warps, stages, a mask form ...) is an input like a size: drawn per
case, shrunk toward each axis's first choice, recorded in the case, replayed. The declared rule
relating a configuration to the case (e.g. a tile too large for the head dim) is applied by
drawing only among the valid combinations, never by rejecting draws.
"""
from __future__ import annotations

import itertools

from hypothesis import strategies as st

from fuzzattn.contract.capabilities import Capabilities
from fuzzattn.contract.case import AttentionCase

from .palette import subset


def valid_configs(caps: Capabilities, case: AttentionCase) -> list[tuple[tuple[str, object], ...]]:
    """Every declared combination the rule allows for `case`, in declaration order (the first
    choices first, so shrinking moves toward the simplest configuration)."""
    return _entry(caps, case).combos


class _Entry:
    """The valid combinations for one (declaration, head dim, dtype, causal), what resource rules
    read (Capabilities.config_rule), and the strategy drawing them; built once."""

    def __init__(self, caps: Capabilities, case: AttentionCase, palette: int | None):
        self.caps = caps                   # kept alive: the cache below is keyed by its id
        self.combos = _valid_configs(caps, case)
        drawn = self.combos if palette is None else subset(self.combos, palette, "config")
        self.strategy = st.sampled_from(unequal_tiles_weighted(drawn)) if drawn else st.nothing()


_ENTRIES: dict = {}


def _entry(caps: Capabilities, case: AttentionCase, palette: int | None = None) -> _Entry:
    key = (id(caps), case.head_dim, case.dtype, case.causal, palette)
    if key not in _ENTRIES:
        _ENTRIES[key] = _Entry(caps, case, palette)
    return _ENTRIES[key]


def _valid_configs(caps: Capabilities, case: AttentionCase) -> list:
    names = [name for name, _ in caps.configs]
    combos = []
    for values in itertools.product(*(choices for _, choices in caps.configs)):
        config = tuple(sorted(zip(names, values)))
        if caps.config_rule is None or not caps.config_rule(dict(config), case.replace(config=config)):
            combos.append(config)
    return combos


# Tile pairs: axes named <prefix>BLOCK_M and <prefix>BLOCK_N (query rows, keys per tile). A loop
# or stage bound that uses one where the other belongs is exact whenever the two are equal, so
# a combination is drawn UNEQUAL_EXTRA times more per pair it draws unequal (set by: a dQ loop
# bounded by BLOCK_N survived 100 dev cases with combinations drawn uniformly).
TILE_PAIR = ("BLOCK_M", "BLOCK_N")
UNEQUAL_EXTRA = 2


def unequal_tiles_weighted(combos: list) -> list:
    """`combos` in their order, then the ones with unequal tile pairs again (UNEQUAL_EXTRA times
    per such pair): sampled from, unequal tiles come more often and shrinking still moves toward
    the first combination."""
    extra = []
    for combo in combos:
        config = dict(combo)
        unequal = sum(config.get(name[:-len("BLOCK_M")] + "BLOCK_N", value) != value
                      for name, value in config.items() if name.endswith(TILE_PAIR[0]))
        extra += [combo] * (UNEQUAL_EXTRA * unequal)
    return list(combos) + extra


def configs(caps: Capabilities, case: AttentionCase,
            palette: int | None = None) -> st.SearchStrategy[tuple]:
    """A valid configuration for `case` (the empty one for configless implementations); with a
    `palette`, one of that palette's few (fuzzattn.strategies.palette)."""
    if not caps.configs:
        return st.just(())
    return _entry(caps, case, palette).strategy


def constrained_length(caps: Capabilities, length: st.SearchStrategy[int],
                       max_len: int) -> st.SearchStrategy[int]:
    """Lengths inside the declared minimum and multiple, drawn directly: a multiple of
    `seq_multiple` at least `min_seq_len`; the profile's maximum is exceeded only when the
    constraints leave nothing below it."""
    if caps.seq_multiple == 1 and caps.min_seq_len <= 1:
        return length
    lo = max(1, -(-max(caps.min_seq_len, 1) // caps.seq_multiple))
    hi = max(lo, max_len // caps.seq_multiple)
    return st.integers(lo, hi).map(lambda m: m * caps.seq_multiple)
