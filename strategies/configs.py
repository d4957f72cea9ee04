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


def valid_configs(caps: Capabilities, case: AttentionCase) -> list[tuple[tuple[str, object], ...]]:
    """Every declared combination the rule allows for `case`, in declaration order (the first
    choices first, so shrinking moves toward the simplest configuration). Cached per
    (declaration, head dim, dtype, causal): what resource rules read (Capabilities.config_rule)."""
    key = (id(caps), case.head_dim, case.dtype, case.causal)
    if key not in _VALID:
        _VALID[key] = (caps, _valid_configs(caps, case))   # caps kept alive: its id stays unique
    return _VALID[key][1]


_VALID: dict = {}


def _valid_configs(caps: Capabilities, case: AttentionCase) -> list:
    names = [name for name, _ in caps.configs]
    combos = []
    for values in itertools.product(*(choices for _, choices in caps.configs)):
        config = tuple(sorted(zip(names, values)))
        if caps.config_rule is None or not caps.config_rule(dict(config), case.replace(config=config)):
            combos.append(config)
    return combos


def configs(caps: Capabilities, case: AttentionCase) -> st.SearchStrategy[tuple]:
    """A valid configuration for `case` (the empty one for configless implementations)."""
    if not caps.configs:
        return st.just(())
    key = (id(caps), case.head_dim, case.dtype, case.causal)
    strategy = _STRATEGIES.get(key)
    if strategy is None:
        combos = valid_configs(caps, case)
        strategy = _STRATEGIES[key] = st.sampled_from(combos) if combos else st.nothing()
    return strategy


_STRATEGIES: dict = {}      # keyed as _VALID (whose entries keep each caps alive)


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
