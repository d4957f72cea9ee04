"""Tiled FlashAttention-2 forward in plain PyTorch: the article's Step 1, re-written and completed.

The same double loop as the article (query tiles outside, key tiles inside, 16-row tiles, online
softmax with running max m, running sum l and unnormalised accumulator), on (B, H, N, D) tensors
of any strides, with what the article left out:

* ragged tails: N need not be a multiple of 16 (slicing simply yields a short last tile);
* causal masking in both alignments, top-left (j <= i) and bottom-right (j <= i + Nk - Nq);
* a sliding window (left, right), bottom-right aligned, a softcap applied before the mask, and
  ALiBi's bias -slope * |i + Nk - Nq - j| added after the softcap;
* rows with no visible key (bottom-right with Nq > Nk, a window, or Nk == 0) give out 0 and
  lse -inf, without NaN: masked scores are -inf and a safe max (0 for a row that has seen
  nothing) is subtracted, so exp never sees -inf - (-inf);
* a paged KV cache (contract/paged.py), gathered through its block table before the loops;
* GQA: q is viewed as (B, Hkv, G, Nq, D) and k, v as (B, Hkv, 1, Nk, D), so query head h reads
  kv head h // G through broadcasting, with no copy of k or v;
* zero lengths: Nq == 0 gives empty outputs, Nk == 0 gives out 0 and lse -inf.

Precision, chosen to mirror the Triton kernel rather than to be the most accurate: tiles are
upcast to fp32 and all running state is fp32 whatever the input dtype (bf16/fp16 products are
exact in fp32, like tl.dot's fp32 accumulation), and P is rounded to the input dtype before P @ V,
as the kernel's `p = p.to(v.dtype)` does. For fp32 inputs that rounding is a no-op.
"""
from __future__ import annotations

import math

import torch

from fuzzattn.contract import Capabilities, Implementation

TILE = 16              # the article's tile_size, for both queries and keys
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
    fp32_matmul="ieee",   # torch fp32 matmul (TF32 is off by default, and off on CPU)
    deterministic=True,
    out_buffer=False,
    window=True,
    softcap=True,
    alibi=True,
    paged_kv=True,
)


def torch_tiled_forward(q, k, v, *, causal, scale, window=(-1, -1), softcap=0.0,
                        alibi_slopes=None, block_table=None, cache_seqlens=None):
    """(out (B,Hq,Nq,D) in q's dtype, lse (B,Hq,Nq) float32) by the tiled online softmax; k, v
    are paged caches (num_blocks, block_size, Hkv, D) when a block table is given."""
    if block_table is not None:
        # Batch b's logical block i is physical block block_table[b, i]: gathered, each
        # sequence's blocks are its keys in order, cut to its length (views, no copy of k, v).
        seq_k = CAPS.check_paged(k, v, block_table, cache_seqlens, q)
        pages = block_table.long()
        k, v = (c[pages].flatten(1, 2)[:, :seq_k].transpose(1, 2) for c in (k, v))
    causal, scale = CAPS.check_inputs(q, k, v, causal=causal, scale=scale)
    (left, right), softcap = CAPS.check_variants(window=window, softcap=softcap)
    alibi_slopes = CAPS.check_alibi(alibi_slopes, q)
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]

    group = heads // kv_heads
    # GQA by broadcasting: unflatten/unsqueeze are views for any strides, so nothing is copied.
    q5 = q.unflatten(1, (kv_heads, group))          # (B, Hkv, G, Nq, D)
    k5, v5 = k.unsqueeze(2), v.unsqueeze(2)         # (B, Hkv, 1, Nk, D)

    out = torch.empty(batch, kv_heads, group, seq_q, head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, kv_heads, group, seq_q, dtype=torch.float32, device=q.device)
    # Bottom-right shifts the diagonal right by Nk - Nq: query i sees keys j <= i + offset.
    offset = seq_k - seq_q if causal == "bottom_right" else 0
    # The window is bottom-right aligned whatever the causal alignment (FlashAttention's).
    diagonal = seq_k - seq_q
    masked = causal != "none" or left >= 0 or right >= 0
    # Query head h's slope, shaped as the scores' (B, Hkv, G, rows, keys) broadcast.
    alibi = None if alibi_slopes is None else alibi_slopes.view(1, kv_heads, group, 1, 1)

    for q0 in range(0, seq_q, TILE):                  # outer loop: query tiles
        q_i = q5[..., q0:q0 + TILE, :].float()
        rows = torch.arange(q0, q0 + q_i.shape[-2], device=q.device)
        m_i = torch.full(q_i.shape[:-1], -math.inf, dtype=torch.float32, device=q.device)
        l_i = torch.zeros_like(m_i)
        acc = torch.zeros(q_i.shape, dtype=torch.float32, device=q.device)

        for k0 in range(0, seq_k, TILE):              # inner loop: key tiles
            k_j = k5[..., k0:k0 + TILE, :].float()
            v_j = v5[..., k0:k0 + TILE, :].float()
            s = (q_i @ k_j.transpose(-1, -2)) * scale                 # (..., rows, keys) fp32
            if softcap:
                s = softcap * torch.tanh(s / softcap)       # before the mask: hidden stays -inf
            if alibi is not None:       # after the cap, before the mask (FlashAttention's order)
                keys = torch.arange(k0, k0 + k_j.shape[-2], device=q.device)
                s = s - alibi * (rows[:, None] + (seq_k - seq_q) - keys[None, :]).abs()
            if masked:
                cols = torch.arange(k0, k0 + k_j.shape[-2], device=q.device)[None, :]
                visible = torch.ones(rows.shape[0], cols.shape[1], dtype=torch.bool,
                                     device=q.device)
                if causal != "none":
                    visible = cols <= rows[:, None] + offset
                if left >= 0:
                    visible = visible & (cols >= rows[:, None] + diagonal - left)
                if right >= 0:
                    visible = visible & (cols <= rows[:, None] + diagonal + right)
                s = s.masked_fill(~visible, -math.inf)

            m_new = torch.maximum(m_i, s.amax(dim=-1))
            # Safe max: rows with nothing visible yet keep m = -inf; subtract 0 so p = alpha = 0.
            m_safe = torch.where(m_new == -math.inf, 0.0, m_new)
            p = torch.exp(s - m_safe[..., None])
            alpha = torch.exp(m_i - m_safe)
            l_i = alpha * l_i + p.sum(dim=-1)
            # Round P to the input dtype, as the kernel does before its second dot.
            p = p.to(q.dtype).float()
            acc = alpha[..., None] * acc + p @ v_j
            m_i = m_new

        empty = l_i == 0                              # no visible key: out 0, lse -inf
        out[..., q0:q0 + TILE, :] = (acc / torch.where(empty, 1.0, l_i)[..., None]).to(q.dtype)
        lse[..., q0:q0 + TILE] = torch.where(empty, -math.inf, m_i + torch.log(l_i))

    return out.flatten(1, 2), lse.flatten(1, 2)


IMPL = Implementation(
    name="torch_tiled",
    fn=torch_tiled_forward,
    caps=CAPS,
    description="The article's tiled PyTorch FA2 forward (16-row tiles, fp32 state, P rounded to "
                "the input dtype), completed: ragged tails, both causal alignments, GQA, empty rows.",
    sources=(__file__,),
)
