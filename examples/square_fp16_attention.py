"""A third-party attention kernel as such kernels are written, declared to fuzzattn from its own
file, with nothing edited in the fuzzattn repository:

    fuzzattn fuzz --impl examples/square_fp16_attention.py:SQUARE_FP16
    pytest --fuzzattn-impl examples/square_fp16_attention.py:SQUARE_FP16

What it accepts is what real kernels accept: fp16 only, Nq == Nk, lengths a multiple of 64,
head dims 64 and 128, contiguous tensors, no causal mask; and it is `@triton.autotune`d over a
dozen configurations. `declare(_attention_kernel)` hands those configurations to the fuzzer as a
configuration space, and `launch_pinned` runs the one a case names, so every configuration is
tested on every machine, not only the one the autotuner picks here.

Seeded bug, on purpose (this file is the README's example of a configuration-only bug): the key
loop advances by BLOCK_M instead of BLOCK_N. Whenever BLOCK_M == BLOCK_N that is the same thing
and the kernel is right; every configuration with BLOCK_M != BLOCK_N skips or double-counts keys.
The default configuration the autotuner tries first is correct, so fixed-configuration tests pass.
"""
import fuzzattn  # noqa: F401  (first: on a machine without a GPU it selects Triton's interpreter)

import torch
import triton
import triton.language as tl

from fuzzattn import Capabilities, Implementation, refuse
from fuzzattn.contract.autotune import declare, launch_pinned

# A dozen configurations: tiles of 32 or 64 rows/keys, each with three launch settings.
CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
           for m in (64, 32) for n in (64, 32) for w, s in ((4, 2), (4, 3), (8, 2))]


@triton.autotune(configs=CONFIGS, key=["N_CTX", "HEAD_DIM"])
@triton.jit
def _attention_kernel(Q, K, V, O, L, N_CTX, scale,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)           # contiguous (B, H, N, D): one (b, h) per program
    base = bh * N_CTX * HEAD_DIM
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for start_n in range(0, N_CTX, BLOCK_M):          # BUG (seeded): should step by BLOCK_N
        keys = start_n + offs_n
        inside = keys < N_CTX                          # masked: the bug must not read past N
        k = tl.load(K + base + keys[:, None] * HEAD_DIM + offs_d[None, :], mask=inside[:, None], other=0.0)
        v = tl.load(V + base + keys[:, None] * HEAD_DIM + offs_d[None, :], mask=inside[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(inside[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(tl.float16), v, acc * alpha[:, None])
        m_i = m_new
    tl.store(O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))
    tl.store(L + bh * N_CTX + offs_m, m_i + tl.log(l_i))


def square_fp16_attention(q, k, v, *, causal, scale, config=None):
    """(out, lse) for fp16 (B, H, N, D) contiguous q, k, v with N a multiple of 64; `config`
    (one of the autotuner's, as a dict) pins the launch, None lets the autotuner choose."""
    causal, scale = SQUARE_FP16.caps.check_inputs(q, k, v, causal=causal, scale=scale)
    if causal != "none":
        refuse("causal", causal, "non-causal only")
    batch, heads, n, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, n, dtype=torch.float32, device=q.device)
    grid = lambda meta: (n // meta["BLOCK_M"], batch * heads)          # noqa: E731
    args = (q, k, v, out, lse, n, scale)
    if config is None:
        _attention_kernel[grid](*args, HEAD_DIM=d)
    else:
        launch_pinned(_attention_kernel, grid, *args, config=config, HEAD_DIM=d)
    return out, lse


SQUARE_FP16 = Implementation(
    name="square_fp16",
    fn=square_fp16_attention,
    caps=Capabilities(dtypes={"float16"}, head_dims={64, 128}, causal=(), gqa=False,
                      strides="contiguous", equal_lengths=True, min_seq_len=64, seq_multiple=64,
                      **declare(_attention_kernel)),
    description="square fp16 attention, autotuned over 12 configurations (example; seeded bug)",
)
