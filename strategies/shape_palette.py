"""Shape palettes: the few shapes a campaign on a kernel compiled per shape draws from.

A kernel behind `torch.compile` with static shapes (FlexAttention, `kernels/flex.py`) compiles
for every new batch, head count, length, head dim, stride pattern and scale (dynamo guards on a
Python float's value), so a campaign that draws each of them freely spends its time compiling:
about 0.3 cases/s for flex on a GPU. A palette campaign (`Capabilities.compiles_per_shape`)
draws instead one of N fixed entries, each fixing all of those, and varies per case what costs
no compile: values, data seeds, the causal alignment (a mask per alignment, compiled once per
entry) and the configuration.

Entries are deterministic in the palette number (a campaign's Hypothesis seed or shard), so the
shards of a run see different shapes. Entry i of palette n takes the shape family
FAMILIES[(n + i) % len(FAMILIES)]: a palette of four covers four families, and the families
rotate over palette numbers, so ragged, decode, chunked prefill, square and tall (empty-row)
shapes all come over a few campaigns; palette 0 (the gate's, a first shard's) has ragged, tall,
decode and square. Entries are sorted by size: Hypothesis shrinks toward the first, the
smallest.

N is the declaration's `palette_shapes`, or FUZZATTN_SHAPES when set.
"""
from __future__ import annotations

import dataclasses
import os
import random

from fuzzattn.contract import Capabilities
from fuzzattn.contract.profiles import Profile

from .layouts import layout_choices
from .lengths import TILE, head_dim_choices

ENV = "FUZZATTN_SHAPES"
FAMILIES = ("ragged", "tall", "decode", "square", "chunk", "multi_block")
SCALES = (1.0, 0.5, 0.125, 2.0, 0.3)        # besides None (1/sqrt(D)), as strategies.cases draws


@dataclasses.dataclass(frozen=True)
class Entry:
    """One compiled variant's worth of a case: everything but causal, values, seed and config."""
    family: str
    batch: int
    kv_heads: int
    group: int
    seq_q: int
    seq_k: int
    head_dim: int
    scale: float | None
    layout: tuple[str, str, str]

    @property
    def size(self) -> int:
        return self.batch * self.kv_heads * self.group * (self.seq_q + self.seq_k) * self.head_dim


def palette_size(caps: Capabilities) -> int:
    """How many entries: FUZZATTN_SHAPES when set (a positive integer), else the declaration's."""
    raw = os.environ.get(ENV, "")
    if not raw:
        return caps.palette_shapes
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{ENV}={raw!r} is not a positive integer")
    return n


def entries(caps: Capabilities, profile: Profile, palette: int, count: int) -> list[Entry]:
    """`count` entries of palette number `palette` inside `caps` and `profile`, smallest first."""
    rng = random.Random(f"shapes:{palette}")
    dims = head_dim_choices(caps.head_dims, max_head_dim=caps.max_head_dim)
    layouts = layout_choices(caps)
    found = []
    for i in range(count):
        family = FAMILIES[(palette + i) % len(FAMILIES)]
        seq_q, seq_k = _lengths(caps, family, rng, profile.max_seq)
        found.append(Entry(
            family=family,
            batch=rng.randint(1, profile.max_batch),
            kv_heads=rng.randint(1, profile.max_kv_heads),
            group=rng.randint(1, profile.max_group) if caps.gqa else 1,
            seq_q=seq_q, seq_k=seq_k,
            head_dim=dims[0] if i == 0 else rng.choice(dims),
            scale=None if rng.random() < 0.5 else rng.choice(SCALES),
            layout=layouts[0] if rng.random() < 0.5 else rng.choice(layouts)))
    return sorted(found, key=lambda e: e.size)


def _lengths(caps: Capabilities, family: str, rng: random.Random, top: int) -> tuple[int, int]:
    """(Nq, Nk) of one family, then fitted to the declared length constraints."""
    top = max(top, 4)
    if family == "square":
        n = rng.randint(1, top)
        pair = (n, n)
    elif family == "decode":
        pair = (1, rng.randint(TILE + 1, top) if top > TILE else rng.randint(1, top))
    elif family == "ragged":          # neither length a multiple of the tile
        pair = tuple(rng.choice([n for n in range(1, top + 1) if n % TILE]) for _ in range(2))
    elif family == "chunk":
        nq = rng.randint(2, max(2, top // 4))
        pair = (nq, rng.randint(2 * nq, top))
    elif family == "tall":            # Nq > Nk: bottom-right leaves rows with no visible key
        nk = rng.randint(1, top - 1)
        pair = (rng.randint(nk + 1, top), nk)
    else:                             # multi_block: several key tiles
        pair = (rng.randint(1, top), rng.randint(min(TILE + 1, top), top))
    return _fit(caps, *pair)


def _fit(caps: Capabilities, seq_q: int, seq_k: int) -> tuple[int, int]:
    """Lengths moved up to the declared minimum and multiple (equal when only equal ones run),
    keeping which of the two is longer: a tall shape stays tall."""
    if caps.equal_lengths:
        seq_k = seq_q

    def fit(n: int) -> int:
        n = max(n, caps.min_seq_len, 1)
        return -(-n // caps.seq_multiple) * caps.seq_multiple
    fitted_q, fitted_k = fit(seq_q), fit(seq_k)
    if seq_q > seq_k and fitted_q <= fitted_k:
        fitted_q = fitted_k + caps.seq_multiple
    elif seq_q < seq_k and fitted_q >= fitted_k:
        fitted_k = fitted_q + caps.seq_multiple
    return fitted_q, fitted_k
