"""SDPA with a sliding window: the window (and causality) as an explicit additive attn_mask.

F.scaled_dot_product_attention has no window argument, so the reference every user writes is a
mask: key j kept for query i iff i + s - left <= j <= i + s + right, s = Nk - Nq (the README's
Variants; -1 leaves a side unbounded), and-ed with causal's j <= i (top-left) or j <= i + s
(bottom-right). Built here from the definition, shared with no kernel and not with the oracle.
SDPA has no softcap (a score_mod needs FlexAttention): only the window is declared.
`masked_sdpa` is the call itself, taking an optional additive bias too: the ALiBi reference
(kernels/sdpa_alibi.py) and the per-sequence varlen loop (kernels/sdpa_varlen.py) are this call.

The mask is the additive float form (0 kept, -inf hidden) in q's dtype, never the boolean one:
default dispatch sends bf16/fp16 with a mask to cuDNN on CUDA, whose boolean form lets a masked
key through (kernels/sdpa_defects.py); the float form is exact on every backend measured. A bias
makes it float32 whatever q's dtype: a bias of hundreds rounded to bf16 would be off by units.

Rows that keep no key (a window past the keys, bottom-right with Nq > Nk, Nk == 0) get every key
in the mask SDPA sees and a zero query, so its softmax and its autograd stay finite, and are then
set to out 0 and lse -inf, the project's convention: torch.where gives them a zero gradient, where
a fully masked row would give NaN to every key through SDPA's backward.

The `sdpa` implementations are untouched: this is one more, run under default dispatch.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from fuzzattn.contract import Implementation
from fuzzattn.kernels import sdpa
from fuzzattn.kernels.sdpa_defects import KNOWN_DEFECTS

# sdpa's declaration with the window, and its own CUDA known defects: sdpa's predicates name
# sdpa's mask forms, while every masked case here (causal or windowed) reaches SDPA as a float
# mask.
CAPS = dataclasses.replace(sdpa.CAPS, window=True, known_defects=KNOWN_DEFECTS["sdpa_window"])


def kept_keys(seq_q: int, seq_k: int, causal: str, window: tuple[int, int],
              device) -> torch.Tensor | None:
    """(Nq, Nk) bool, True where query i keeps key j; None when every key is kept."""
    left, right = window
    if causal == "none" and left < 0 and right < 0:
        return None
    rows = torch.arange(seq_q, device=device)[:, None]
    cols = torch.arange(seq_k, device=device)[None, :]
    shift = seq_k - seq_q                  # the window is bottom-right aligned, as FA2's
    kept = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    if causal != "none":
        kept &= cols - rows <= (shift if causal == "bottom_right" else 0)
    if left >= 0:
        kept &= cols - rows >= shift - left
    if right >= 0:
        kept &= cols - rows <= shift + right
    return kept


def masked_sdpa(q, k, v, *, causal: str, scale: float, window: tuple[int, int],
                bias: torch.Tensor | None = None):
    """(out, lse) of SDPA on checked inputs, causality and the window as a float mask, plus
    `bias` ((Hq, Nq, Nk) float32, added to the scaled scores before the mask) when given."""
    heads, seq_q = q.shape[1], q.shape[2]
    kv_heads, seq_k = k.shape[1], k.shape[2]
    kept = kept_keys(seq_q, seq_k, causal, window, q.device)
    empty = None                                        # (Nq,) rows keeping no key
    if kept is not None:
        empty = ~kept.any(dim=-1)
    elif seq_k == 0:
        empty = torch.ones(seq_q, dtype=torch.bool, device=q.device)
    if empty is not None:
        # Their queries are zeroed too: SDPA's CPU backward recomputes their softmax from the
        # scores, and scores near 1e13 (values=sentinel_sweep) overflowed there to a NaN dq
        # times the zero gradient torch.where gives them.
        q = torch.where(empty[:, None], torch.zeros((), dtype=q.dtype, device=q.device), q)
    mask = bias
    if kept is not None:
        seen = kept | empty[:, None]
        if mask is None:
            mask = torch.zeros(seen.shape, dtype=q.dtype, device=q.device)
        mask = mask.masked_fill(~seen, -math.inf)
    q, k, v = (sdpa._aligned_for_cuda(t) for t in (q, k, v))
    gqa = dict(enable_gqa=True) if kv_heads != heads else {}
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **gqa)

    # lse in fp32 from the inputs, as sdpa's (SDPA does not return its own).
    q5 = q.unflatten(1, (kv_heads, heads // kv_heads)).float()
    scores = (q5 @ k.unsqueeze(2).float().transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.unflatten(0, (kv_heads, heads // kv_heads))
    if kept is not None:
        scores = scores.masked_fill(~kept, -math.inf)
    if seq_k == 0:
        lse = torch.full(scores.shape[:-1], -math.inf, dtype=torch.float32, device=q.device)
    else:
        lse = torch.logsumexp(scores, dim=-1)       # rows keeping no key: -inf
    lse = lse.flatten(1, 2)
    if empty is not None:
        out = torch.where(empty[:, None], torch.zeros((), dtype=out.dtype, device=out.device), out)
    return out, lse


def sdpa_window_forward(q, k, v, *, causal, scale, window=(-1, -1)):
    """(out (B,Hq,Nq,D) in q's dtype, lse (B,Hq,Nq) float32): SDPA under the window's mask."""
    causal, scale = CAPS.check_inputs(q, k, v, causal=causal, scale=scale)
    window, _ = CAPS.check_variants(window=window, softcap=0.0)
    return masked_sdpa(q, k, v, causal=causal, scale=scale, window=window)


IMPL = Implementation(
    name="sdpa_window",
    fn=sdpa_window_forward,
    caps=CAPS,
    description="torch.nn.functional.scaled_dot_product_attention with causality and a sliding "
                "window as an explicit float mask, lse computed beside it in fp32.",
    sources=(__file__, sdpa.__file__),
)
