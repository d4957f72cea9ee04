"""A second third-party attention kernel as such kernels are written: autotuned over a wide
configuration list, causal in two stages, declared to fuzzattn from its own file.

    fuzzattn fuzz --impl examples/autotuned_causal_attention.py:AUTOTUNED_CAUSAL

It takes fp16 and bf16, contiguous (B, H, N, D) tensors with any Nq and Nk, head dims 16, 32, 64
and 128, non-causal or top-left causal. `@triton.autotune` lists 36 configurations (BLOCK_M and
BLOCK_N of 16, 32 and 64; 4 or 8 warps; 1 or 2 stages), and the kernel asserts at compile time
that a key tile is no wider than the head dim (`tl.static_assert(BLOCK_N <= HEAD_DIM)`), so for
D = 16 only BLOCK_N = 16 compiles and for D = 32 only BLOCK_N <= 32: the autotuner skips the rest,
and so should a fuzzer. Causal attention runs in two stages, as FlashAttention's Triton tutorial
does: key blocks every query of the tile sees, without a mask, then the diagonal blocks, masked.

Three independent seeded defects, each in its own configurations, shapes or value range:

1. `diagonal`: the diagonal stage ends at start_m + BLOCK_N instead of start_m + BLOCK_M, so with
   BLOCK_M > BLOCK_N the last rows of a causal query tile miss their nearest keys (causal only;
   every configuration with BLOCK_M == BLOCK_N or BLOCK_M < BLOCK_N is right).
2. `finite_max`: the running max starts at -1e6 instead of -inf. The max is then still each row's
   largest score, until every score of a row lies below -1e6: exp underflows, the row sum is 0
   and the output NaN (value range only: `values=below_sentinel`; any config, any shape).
3. `lse_rows`: the lse store also masks rows at or past Nk, so with Nq > Nk the last Nq - Nk lse
   rows are never written (shape: Nq > Nk; any config, any values).
"""
import fuzzattn  # noqa: F401  (first: on a machine without a GPU it selects Triton's interpreter)

import torch
import triton
import triton.language as tl

from fuzzattn import Capabilities, Implementation
from fuzzattn.contract.autotune import declare, launch_pinned

CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
           for m in (16, 32, 64) for n in (16, 32, 64) for w in (4, 8) for s in (1, 2)]


@triton.jit
def _attend_blocks(acc, l_i, m_i, q, K, V, base_k, offs_m, offs_d, lo, hi, N_CTX_K, scale,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                   CAUSAL: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)
        inside = keys < N_CTX_K
        k = tl.load(K + base_k + keys[:, None] * HEAD_DIM + offs_d[None, :], mask=inside[:, None], other=0.0)
        v = tl.load(V + base_k + keys[:, None] * HEAD_DIM + offs_d[None, :], mask=inside[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        if MASKED:
            keep = inside[None, :]
            if CAUSAL:
                keep = keep & (keys[None, :] <= offs_m[:, None])
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(configs=CONFIGS, key=["N_CTX_Q", "N_CTX_K", "HEAD_DIM", "CAUSAL"])
@triton.jit
def _causal_attention_kernel(Q, K, V, O, L, N_CTX_Q, N_CTX_K, scale, HEAD_DIM: tl.constexpr,
                             CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tl.static_assert(BLOCK_N <= HEAD_DIM)      # a key tile no wider than the head dim
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    base_q = bh * N_CTX_Q * HEAD_DIM
    base_k = bh * N_CTX_K * HEAD_DIM
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < N_CTX_Q
    q = tl.load(Q + base_q + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=rows[:, None], other=0.0)
    m_i = tl.full((BLOCK_M,), -1.0e6, tl.float32)    # BUG 2 (seeded): should start at -inf
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    full_blocks = (N_CTX_K // BLOCK_N) * BLOCK_N
    if CAUSAL:
        # stage 1: key blocks every query of this tile sees; stage 2: the diagonal, masked
        seen_by_all = tl.minimum((start_m // BLOCK_N) * BLOCK_N, full_blocks)
        acc, l_i, m_i = _attend_blocks(acc, l_i, m_i, q, K, V, base_k, offs_m, offs_d, 0, seen_by_all,
                                       N_CTX_K, scale, HEAD_DIM, BLOCK_N, False, True)
        diagonal_end = tl.minimum(start_m + BLOCK_N, N_CTX_K)   # BUG 1 (seeded): + BLOCK_M
        acc, l_i, m_i = _attend_blocks(acc, l_i, m_i, q, K, V, base_k, offs_m, offs_d, seen_by_all,
                                       diagonal_end, N_CTX_K, scale, HEAD_DIM, BLOCK_N, True, True)
    else:
        acc, l_i, m_i = _attend_blocks(acc, l_i, m_i, q, K, V, base_k, offs_m, offs_d, 0, full_blocks,
                                       N_CTX_K, scale, HEAD_DIM, BLOCK_N, False, False)
        acc, l_i, m_i = _attend_blocks(acc, l_i, m_i, q, K, V, base_k, offs_m, offs_d, full_blocks,
                                       N_CTX_K, N_CTX_K, scale, HEAD_DIM, BLOCK_N, True, False)
    out = acc / l_i[:, None]
    tl.store(O + base_q + offs_m[:, None] * HEAD_DIM + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=rows[:, None])
    # BUG 3 (seeded): "rows that see a key" is a bottom-right notion; top-left rows all do: rows
    tl.store(L + bh * N_CTX_Q + offs_m, m_i + tl.log(l_i), mask=rows & (offs_m < N_CTX_K))


def autotuned_causal_attention(q, k, v, *, causal, scale, config=None):
    """(out, lse) for contiguous fp16/bf16 (B, H, N, D); `config` (one of CONFIGS as a dict) pins
    the launch, None lets the autotuner choose."""
    causal, scale = AUTOTUNED_CAUSAL.caps.check_inputs(q, k, v, causal=causal, scale=scale)
    batch, heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, seq_q, dtype=torch.float32, device=q.device)
    grid = lambda meta: (triton.cdiv(seq_q, meta["BLOCK_M"]), batch * heads)     # noqa: E731
    args = (q, k, v, out, lse, seq_q, seq_k, scale)
    flags = dict(HEAD_DIM=head_dim, CAUSAL=causal == "top_left")
    if config is None:
        _causal_attention_kernel[grid](*args, **flags)
    else:
        launch_pinned(_causal_attention_kernel, grid, *args, config=config, **flags)
    return out, lse


AUTOTUNED_CAUSAL = Implementation(
    name="autotuned_causal",
    fn=autotuned_causal_attention,
    caps=Capabilities(dtypes={"float16", "bfloat16"}, head_dims={16, 32, 64, 128},
                      causal=("top_left",), gqa=False, strides="contiguous",
                      **declare(_causal_attention_kernel)),
    description="autotuned causal attention over 36 configurations (example; 3 seeded defects)",
)
