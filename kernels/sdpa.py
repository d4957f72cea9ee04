"""PyTorch's scaled_dot_product_attention as an implementation under test, with lse beside it.

SDPA returns only the output, so the lse is computed here, in fp32 from the same inputs: the
logsumexp of the scaled, masked scores. It is therefore an fp32 reference value, not SDPA's own
internal statistic (which the public API does not expose).

Causal: top-left is SDPA's `is_causal=True` (key j visible to query i iff j <= i); bottom-right
(j <= i + Nk - Nq, FlashAttention >= 2.1) is an explicit boolean mask, tril with diagonal Nk - Nq.

Rows with no visible key (bottom-right with Nq > Nk): measured on torch 2.13.0+cpu, SDPA returns
0 for them (default dispatch, and the MATH and FLASH_ATTENTION backends alike, for fp32, bf16 and
fp16); older releases' math path gave NaN (softmax of an all -inf row). We do not rely on either:
such rows are set to out 0 and lse -inf explicitly, the project's convention.

Zero lengths (torch 2.13.0+cpu): Nq == 0 returns an empty (B, H, 0, D) tensor and Nk == 0 returns
zeros, with or without is_causal; the adapter still forces Nk == 0 to out 0 / lse -inf itself.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fuzzattn.contract import Capabilities, Implementation

MAX_HEAD_DIM = 256


CAPS = Capabilities(
    dtypes={"float32", "bfloat16", "float16"},
    head_dims=None,
    max_head_dim=MAX_HEAD_DIM,
    causal=("top_left", "bottom_right"),
    gqa=True,
    strides="any",
    zero_length=True,
    returns_lse=True,
    backward=True,                   # gradients by autograd of the forward
    fp32_matmul="ieee",
    # CPU SDPA reruns are bitwise identical; CUDA flash/cuDNN forwards are too (no atomics in
    # the forward pass).
    deterministic=True,
    out_buffer=False,
    # CPU autograd reruns are bitwise identical (measured: every gradient test here). On CUDA the
    # flash and memory-efficient backwards accumulate dq with atomic adds (the FA #359 class), so
    # reruns may differ in the last bits: not declared there (not yet measured on the H200).
    deterministic_backward=not torch.cuda.is_available(),
)


def sdpa_forward(q, k, v, *, causal, scale):
    """(out (B,Hq,Nq,D) in q's dtype, lse (B,Hq,Nq) float32) from F.scaled_dot_product_attention."""
    causal, scale = CAPS.check_inputs(q, k, v, causal=causal, scale=scale)
    heads, seq_q = q.shape[1], q.shape[2]
    kv_heads, seq_k = k.shape[1], k.shape[2]

    # visible[i, j]: may query i see key j? None when every key is visible.
    visible = _visible_keys(seq_q, seq_k, causal, q.device)

    # CUDA flash backend (torch 2.11 on an H200) faults with "misaligned address" when a base
    # pointer is not 16-byte aligned (fp16, storage offset 91 elements); the fault poisons the
    # CUDA context and ends the whole run. Copy such inputs to fresh (aligned) memory: this moves
    # bytes, never changes values, and leaves SDPA's arithmetic under test.
    q, k, v = (_aligned_for_cuda(t) for t in (q, k, v))
    gqa = dict(enable_gqa=True) if kv_heads != heads else {}   # torch >= 2.5: no k/v copy
    if causal == "bottom_right":
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale, **gqa)
    else:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal == "top_left", scale=scale, **gqa)

    # lse in fp32 from the inputs; GQA by broadcasting (B, Hkv, G, Nq, D) against (B, Hkv, 1, Nk, D).
    q5 = q.unflatten(1, (kv_heads, heads // kv_heads)).float()
    scores = (q5 @ k.unsqueeze(2).float().transpose(-1, -2)) * scale
    if visible is not None:
        scores = scores.masked_fill(~visible, -math.inf)
    if seq_k == 0:
        lse = torch.full(scores.shape[:-1], -math.inf, dtype=torch.float32, device=q.device)
    else:
        lse = torch.logsumexp(scores, dim=-1)      # all -inf rows give -inf, not NaN
    lse = lse.flatten(1, 2)

    # Rows that see no key: the convention is out 0, lse -inf, whatever SDPA chose to return.
    empty = (torch.ones(seq_q, dtype=torch.bool, device=q.device) if seq_k == 0
             else (~visible.any(dim=-1) if visible is not None else None))
    if empty is not None and bool(empty.any()):
        out = out.masked_fill(empty[:, None], 0.0)
        lse = lse.masked_fill(empty, -math.inf)
    return out, lse


def _visible_keys(seq_q: int, seq_k: int, causal: str, device) -> torch.Tensor | None:
    """(Nq, Nk) bool, True where query i may see key j; None when every key is visible.
    Built here, not borrowed from the oracle: a mask bug shared by both sides would be invisible
    to the differential. Key j is visible to query i iff j - i <= offset (0 for top-left,
    Nk - Nq for bottom-right)."""
    if causal == "none":
        return None
    offset = 0 if causal == "top_left" else seq_k - seq_q
    rows = torch.arange(seq_q, device=device)[:, None]
    cols = torch.arange(seq_k, device=device)[None, :]
    return cols - rows <= offset


def _aligned_for_cuda(t: torch.Tensor) -> torch.Tensor:
    """t itself, or a contiguous copy when on CUDA its base or a row stride is not 16-byte aligned."""
    if t.device.type != "cuda":
        return t
    size = t.element_size()
    misaligned = t.data_ptr() % 16 != 0 or any(
        (stride * size) % 16 for stride, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1)
    # clone, not contiguous(): a contiguous view at an odd storage offset would come back as is.
    return t.clone(memory_format=torch.contiguous_format) if misaligned else t


IMPL = Implementation(
    name="sdpa",
    fn=sdpa_forward,
    caps=CAPS,
    description="torch.nn.functional.scaled_dot_product_attention (is_causal for top-left, a "
                "boolean tril mask for bottom-right), lse computed beside it in fp32.",
    sources=(__file__,),
)
