"""A third-party Triton attention forward over a paged KV cache, as decode-time kernels (vLLM,
FlashInfer, FlashAttention's `flash_attn_with_kvcache`) read one, declared to fuzzattn from its
own file.

    fuzzattn fuzz --impl examples/paged_kv_attention.py:PAGED_KV

k_cache and v_cache are (num_blocks, page_size, Hkv, D); an int32 `block_table` (B, max_blocks)
names the physical page holding sequence b's logical page i, and int32 `cache_seqlens` (B,) each
sequence's length. Each key tile gathers its keys one by one through the table (page
`key // page_size`, slot `key % page_size`), so any page size works, powers of two or not. A dense
call (no table) is one page per sequence: k's own (B, Hkv, Nk, D) strides read as a cache. fp32,
fp16 and bf16; head dims 16 to 128; GQA; non-causal or causal, either alignment.

Seeded bug, on purpose (PAGED_KV; PAGED_KV_FIXED is the same kernel without it):

    The sequence is taken to end where its last page ends, `cdiv(seq_len, page_size) *
    page_size` keys, not at `cache_seqlens`: the count a kernel that iterates pages gets when it
    masks slots by the page size alone. The last page's slots past the sequence's end then join
    the softmax. In a real cache they hold stale keys from an evicted sequence (a wrong answer);
    fuzzattn fills them with NaN (the output turns NaN). It shows only when the cache is paged
    and Nk is not a multiple of the page size: dense calls, and full last pages, are right.

With default flags the first case drawn in each dtype's campaign holds it, and each campaign
reports it as one row, `needs last page partial paged_kv=...`, shrunk to B=1 H=1 Nq=1 Nk=1 in
pages of 2. tests/user_facing/test_paged_example.py pins that (float32, 30 cases), and that
PAGED_KV_FIXED passes the same campaign.
"""
import fuzzattn  # noqa: F401  (first: on a machine without a GPU it selects Triton's interpreter)

import torch
import triton
import triton.language as tl

from fuzzattn import Capabilities, Implementation

BLOCK_M = 16        # query rows a program
BLOCK_N = 16        # keys a step of the inner loop, gathered from as many pages as they span
_ALIGNMENTS = {"none": 0, "top_left": 1, "bottom_right": 2}
# What the launcher takes (anything else is refused in one line): the declaration of both
# implementations below.
CAPS = Capabilities(dtypes={"float32", "float16", "bfloat16"}, head_dims={16, 32, 64, 128},
                    causal=("top_left", "bottom_right"), gqa=True, strides="any",
                    paged_kv=True)


@triton.jit
def _paged_attention_kernel(Q, K_cache, V_cache, Block_table, Seqlens, Out, Lse,
                            stride_qb, stride_qh, stride_qm, stride_qd,
                            stride_kp, stride_ks, stride_kh, stride_kd,
                            stride_vp, stride_vs, stride_vh, stride_vd,
                            stride_ob, stride_oh, stride_om, stride_od, stride_tb,
                            seq_q, page_size, group, scale,
                            HEAD_DIM: tl.constexpr, ALIGN: tl.constexpr,
                            WHOLE_PAGES: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    kv_h = h // group                                   # GQA: G query heads share one kv head
    seq_k = tl.load(Seqlens + b)
    if WHOLE_PAGES:
        n_keys = tl.cdiv(seq_k, page_size) * page_size  # BUG (seeded): the last page taken whole
    else:
        n_keys = seq_k
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < seq_q
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm
                + offs_d[None, :] * stride_qd, mask=rows[:, None], other=0.0)
    # Bottom-right alignment puts query i's diagonal at key i + Nk - Nq (FlashAttention >= 2.1).
    shift = seq_k - seq_q if ALIGN == 2 else 0
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for start_n in range(0, n_keys, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)
        inside = keys < n_keys
        page = tl.load(Block_table + b * stride_tb + keys // page_size, mask=inside, other=0)
        slot = keys % page_size
        k = tl.load(K_cache + page[:, None].to(tl.int64) * stride_kp + slot[:, None] * stride_ks
                    + kv_h * stride_kh + offs_d[None, :] * stride_kd, mask=inside[:, None], other=0.0)
        v = tl.load(V_cache + page[:, None].to(tl.int64) * stride_vp + slot[:, None] * stride_vs
                    + kv_h * stride_vh + offs_d[None, :] * stride_vd, mask=inside[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        keep = inside[None, :]
        if ALIGN != 0:
            keep = keep & (keys[None, :] <= offs_m[:, None] + shift)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no key keeps m = -inf: subtract 0 so exp sees no -inf - (-inf).
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new
    empty = l_i == 0.0                                  # no visible key: out 0, lse -inf
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    tl.store(Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om
             + offs_d[None, :] * stride_od, out.to(Out.dtype.element_ty), mask=rows[:, None])
    lse = tl.where(empty, float("-inf"), m_i + tl.log(l_safe))
    tl.store(Lse + (b * tl.num_programs(2) + h) * seq_q + offs_m, lse, mask=rows)


def _dense_view(cache: torch.Tensor, batch: int, seq_k: int) -> torch.Tensor:
    """A (B, Hkv, Nk, D) broadcast view of one cache row, for checking shapes and dtypes alone."""
    return cache[:1, :1].permute(0, 2, 1, 3).expand(batch, cache.shape[2], seq_k, cache.shape[3])


def paged_attention(q, k, v, *, causal, scale, block_table=None, cache_seqlens=None,
                    whole_pages=False):
    """(out (B, Hq, Nq, D) in q's dtype, lse (B, Hq, Nq) float32) for q (B, Hq, Nq, D) against
    paged caches k, v (num_blocks, page_size, Hkv, D) read through `block_table`, or dense k, v
    (B, Hkv, Nk, D) when no table is given. `whole_pages` seeds the bug."""
    batch = q.shape[0]
    if block_table is None:
        causal, scale = CAPS.check_inputs(q, k, v, causal=causal, scale=scale)
        seq_k = k.shape[2]
        # Dense: sequence b is page b, its keys the page's slots; the (B, Nk, Hkv, D) views keep
        # k's and v's own strides.
        k_cache, v_cache = k.transpose(1, 2), v.transpose(1, 2)
        block_table = torch.arange(batch, dtype=torch.int32, device=q.device).view(batch, 1)
        cache_seqlens = torch.full((batch,), seq_k, dtype=torch.int32, device=q.device)
    else:
        seq_k = CAPS.check_paged(k, v, block_table, cache_seqlens, q)
        causal, scale = CAPS.check_inputs(
            q, _dense_view(k, batch, seq_k), _dense_view(v, batch, seq_k), causal=causal,
            scale=scale)
        k_cache, v_cache = k, v
    _, heads, seq_q, head_dim = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, seq_q, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(seq_q, BLOCK_M), batch, heads)
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, block_table, cache_seqlens, out, lse,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(), block_table.stride(0),
        seq_q, k_cache.shape[1], heads // k_cache.shape[2], scale,
        HEAD_DIM=head_dim, ALIGN=_ALIGNMENTS[causal], WHOLE_PAGES=whole_pages,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    return out, lse


def fixed_paged_attention(q, k, v, *, causal, scale, block_table=None, cache_seqlens=None):
    """paged_attention with each sequence ending at its `cache_seqlens`."""
    return paged_attention(q, k, v, causal=causal, scale=scale, block_table=block_table,
                           cache_seqlens=cache_seqlens, whole_pages=False)


def buggy_paged_attention(q, k, v, *, causal, scale, block_table=None, cache_seqlens=None):
    """paged_attention with the seeded bug: every sequence read to the end of its last page."""
    return paged_attention(q, k, v, causal=causal, scale=scale, block_table=block_table,
                           cache_seqlens=cache_seqlens, whole_pages=True)


PAGED_KV = Implementation(
    name="paged_kv", fn=buggy_paged_attention, caps=CAPS,
    description="Triton attention over a paged KV cache (example; last page read whole)")

PAGED_KV_FIXED = Implementation(
    name="paged_kv_fixed", fn=fixed_paged_attention, caps=CAPS,
    description="Triton attention over a paged KV cache (example; the seeded bug fixed)")
