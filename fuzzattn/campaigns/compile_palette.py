"""Which compile palette (strategies/palette.py) a campaign draws with.

FUZZATTN_PALETTE chooses: `auto` (the default) narrows compiled Triton kernels and
implementations declaring `compiles_per_shape` (torch.compile'd ones such as flex, which compile
on the CPU too), whose new variants are compiles; `off` draws from everything declared for every
implementation (a campaign that values reach over speed); `on` narrows every Triton kernel,
interpreted too (how to measure on the CPU what palettes cost in bugs found). A palette of a
`compiles_per_shape` implementation fixes its shapes as well (strategies/shape_palette.py, sized
by FUZZATTN_SHAPES or the declaration). The campaign's number is its first palette: a long
campaign moves on to others (campaigns/rotation.py).
"""
from __future__ import annotations

import os

from fuzzattn.contract import Implementation
from fuzzattn.triton_interpreter.backend import is_interpreted

ENV = "FUZZATTN_PALETTE"
CHOICES = ("auto", "off", "on")


def palette_mode() -> str:
    mode = os.environ.get(ENV, "auto") or "auto"
    if mode not in CHOICES:
        raise ValueError(f"{ENV}={mode!r} is not one of {', '.join(CHOICES)}")
    return mode


def campaign_palette(impl: Implementation, number: int, dtype: str | None = None) -> int | None:
    """The palette a campaign numbered `number` (its Hypothesis seed or shard) draws with: that
    number for a compiled Triton kernel, a declared per-shape compiler, or a campaign whose
    dtype (`dtype`, None: every declared one) builds a plan per shape; None (everything
    declared) for anything else, where narrowing the drawn axes would buy nothing.
    FUZZATTN_PALETTE overrides (module docstring)."""
    mode = palette_mode()
    if mode == "off":
        return None
    if impl.caps.per_shape(impl.caps.dtypes if dtype is None else {dtype}):
        return number
    if impl.backend != "triton":
        return None
    if mode == "on" or not is_interpreted():
        return number
    return None
