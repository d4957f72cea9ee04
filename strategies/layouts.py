"""Memory layouts for q, k and v, drawn independently per tensor."""
from __future__ import annotations

import itertools

from hypothesis import strategies as st

from fuzzattn.contract.case import KV_ONLY_LAYOUTS, LAYOUTS
from fuzzattn.contract import Capabilities


def _allowed(caps: Capabilities, tensor: str) -> list[str]:
    return [l for l in LAYOUTS if caps.accepts_layout(l)
            and not (tensor == "q" and l in KV_ONLY_LAYOUTS)]


def layout_choices(caps: Capabilities) -> list[tuple[str, str, str]]:
    """Every (q, k, v) combination the capabilities accept, all-contiguous first."""
    plain = ("contiguous",) * 3
    return [plain] + [c for c in itertools.product(*(_allowed(caps, t) for t in "qkv")) if c != plain]


def layouts(caps: Capabilities) -> st.SearchStrategy[tuple[str, str, str]]:
    """(q, k, v) layouts the capabilities accept. All-contiguous is one branch of its own (so
    about half the cases are plain and shrinking reaches it); otherwise each tensor independently."""
    plain = st.just(("contiguous",) * 3)
    mixed = st.tuples(*(st.sampled_from(_allowed(caps, t)) for t in "qkv"))
    return st.one_of(plain, mixed)
