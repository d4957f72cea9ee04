"""SDPA with ALiBi: the bias, causality and the window as one explicit float32 attn_mask.

SDPA has no alibi_slopes argument; the reference a user writes adds the bias to the mask. Query
head h's bias for query i and key j is -slope_h * |i + Nk - Nq - j|, the distance from the
bottom-right diagonal whatever the causal alignment (FlashAttention's definition, the README's
Variants), built here from that definition in float32 (the slopes are float32) and shared with no
kernel and not with the oracle. Causality and the window then hide keys with -inf on top of it
(kernels/sdpa_window.py's `masked_sdpa`, which also gives rows keeping no key out 0, lse -inf).

The bias stays float32 for bf16/fp16 inputs, where a bias of hundreds rounded to bf16 would move
a score by units; the call is then made on float32 copies of q, k, v (out cast back, gradients
flowing through the casts). SDPA on CUDA cannot take a float32 mask with half inputs: its
memory-efficient kernel requires the bias in the query's dtype ("invalid dtype for bias"). No
softcap: SDPA has no score_mod.
"""
from __future__ import annotations

import dataclasses

import torch

from fuzzattn.contract import Implementation
from fuzzattn.kernels import sdpa, sdpa_window
from fuzzattn.kernels.sdpa_defects import KNOWN_DEFECTS
from fuzzattn.kernels.sdpa_window import masked_sdpa

# sdpa_window's declaration with ALiBi, and the CUDA known defect a GPU campaign of it met
# (kernels/sdpa_defects.py): without a bias it makes sdpa_window's call.
CAPS = dataclasses.replace(sdpa_window.CAPS, alibi=True,
                           known_defects=KNOWN_DEFECTS["sdpa_alibi"])


def alibi_mask(slopes: torch.Tensor, seq_q: int, seq_k: int) -> torch.Tensor:
    """(Hq, Nq, Nk) float32: -slope_h * |i + Nk - Nq - j|."""
    diagonal = torch.arange(seq_q, device=slopes.device)[:, None] + (seq_k - seq_q)
    distance = (diagonal - torch.arange(seq_k, device=slopes.device)[None, :]).abs()
    return -slopes[:, None, None] * distance.float()


def sdpa_alibi_forward(q, k, v, *, causal, scale, window=(-1, -1), alibi_slopes=None):
    """(out (B,Hq,Nq,D) in q's dtype, lse (B,Hq,Nq) float32): SDPA under the bias and mask."""
    causal, scale = CAPS.check_inputs(q, k, v, causal=causal, scale=scale)
    window, _ = CAPS.check_variants(window=window, softcap=0.0)
    slopes = CAPS.check_alibi(alibi_slopes, q)
    if slopes is None:
        return masked_sdpa(q, k, v, causal=causal, scale=scale, window=window)
    bias = alibi_mask(slopes, q.shape[2], k.shape[2])
    out, lse = masked_sdpa(q.float(), k.float(), v.float(), causal=causal, scale=scale,
                           window=window, bias=bias)
    return out.to(q.dtype), lse


IMPL = Implementation(
    name="sdpa_alibi",
    fn=sdpa_alibi_forward,
    caps=CAPS,
    description="torch.nn.functional.scaled_dot_product_attention with the ALiBi bias, causality "
                "and a sliding window as one explicit float32 mask (float32 inputs under a bias), "
                "lse computed beside it in fp32.",
    sources=(__file__, sdpa_window.__file__, sdpa.__file__),
)
