"""Which compile palette (strategies/palette.py) a campaign draws with."""
from __future__ import annotations

from fuzzattn.contract import Implementation
from fuzzattn.engine.triton_backend import is_interpreted


def campaign_palette(impl: Implementation, number: int) -> int | None:
    """The palette a campaign numbered `number` (its Hypothesis seed or shard) draws with: that
    number for a compiled Triton kernel, whose new variants are compiles; None (everything
    declared) for anything else, where narrowing the drawn axes would buy nothing."""
    if impl.backend != "triton" or is_interpreted():
        return None
    return number
