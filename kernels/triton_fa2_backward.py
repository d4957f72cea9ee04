"""FlashAttention-2 backward in Triton: dq, dk, dv from q, k, v, out, lse and dout.

Same conventions as the forward (kernels/triton_fa2.py): (B, H, N, D) tensors with every stride
honoured, pointer arithmetic + masks, D padded to a power-of-two BLOCK_D >= 16, int64 (batch,
head) base offsets, GQA with query head h reading kv head h // (Hq // Hkv), lse the natural-log
logsumexp of the scaled, masked scores, -inf for a row that sees no key.

Three kernels, as in FA2:

1. `bwd_preprocess_kernel`: Delta_i = rowsum(dO_i * O_i) in fp32 (= rowsum(P_i * dP_i), the
   softmax-Jacobian term), once per query row instead of once per (row, key block).
2. `bwd_dkdv_kernel`: one program per (key block, kv head, batch). K and V stay on chip; the
   program loops over the GROUP_SIZE query heads that share the kv head and over their query
   blocks, recomputing P = exp(S - lse), and accumulates dV += P^T dO, dS = P * (dP - Delta),
   dK += dS^T Q (times scale at the end). Summing the group inside one program is what makes dk
   and dv the GQA-summed gradients without a reduction afterwards.
3. `bwd_dq_kernel`: one program per (query block, query head, batch) that loops over key blocks
   and accumulates dQ = dS K * scale.

dQ is a second pass, not atomics in the dK/dV kernel: fp32 `tl.atomic_add`s in the GPU's
scheduling order make dQ differ from run to run (FA #359 / #1678 class). Each program of the
second pass owns its dQ rows and sums their key blocks in one fixed order: deterministic, at the
price of computing S = Q K^T and dP = dO V^T twice (7 block matmuls per block pair instead of 5;
benchmarks/speed.py --pass backward times the whole backward against SDPA). With no atomic path, the
"dQ race" class of bug cannot be planted in this kernel.

Precision, as FA2: fp32 accumulation everywhere; P and dS are rounded to the input dtype before
their matmuls (dV += P^T dO, dK += dS^T Q, dQ += dS K), because tensor cores take both operands
in one dtype. fp32 inputs use tl.dot's default: TF32 compiled on CUDA, IEEE in the interpreter.

Block skipping: the dK/dV kernel visits only the query blocks that can see some key of its
block; the dQ kernel only the key blocks its rows can see. Blocks wholly hidden are never loaded.
Masks are two runtime shifts (kernels/triton_fa2_variants.py): key j is visible to query i iff
i + LEFT_SHIFT <= j (a window's left edge) and j <= i + CAUSAL_SHIFT (causal's diagonal, 0
top-left or Nk - Nq bottom-right, or a window's right edge, whichever is nearer). A softcap
recomputes c * tanh(x / c) and multiplies dS by its slope 1 - tanh^2.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fuzzattn.contract import Capabilities, refuse
from fuzzattn.triton_interpreter.backend import ensure_backend, is_interpreted
from fuzzattn.kernels import triton_fa2_variants as variants
# The configuration space, its defaults and shared-memory rule: re-exported, part of this
# kernel's interface.
from fuzzattn.kernels.triton_fa2_configs import (  # noqa: F401
    BACKWARD_CONFIG_SPACE, MAX_HEAD_DIM, _COMPILED_DEFAULTS, block_d, default_backward_config
    as default_config, resolve_backward_config as _resolve_config,
    backward_config_invalid as config_invalid)

# Must precede the @triton.jit decorations below (they read TRITON_INTERPRET when they run).
ensure_backend()

CAPS = Capabilities(
    dtypes={"float32", "bfloat16", "float16"},
    head_dims=None,                  # any D in 1..MAX_HEAD_DIM: padded to BLOCK_D with masks
    max_head_dim=MAX_HEAD_DIM,
    causal=("top_left", "bottom_right"),
    gqa=True,
    strides="any",
    zero_length=False,
    returns_lse=True,
    window=True,
    softcap=True,
    backward=True,
    fp32_matmul="ieee" if is_interpreted() else "tf32",
    deterministic=True,              # no atomics: every program owns the gradient rows it writes
    out_buffer=False,
)


# As in the forward (FORWARD_UNSPECIALIZED): lengths, the group, the shift and batch/head strides
# are per-program scalars, not specialised; row and element strides are.
_SCALARS = ("N_QUERIES", "N_KEYS", "HEAD_DIM", "GROUP_SIZE", "CAUSAL_SHIFT", "LEFT_SHIFT")
PREPROCESS_UNSPECIALIZED = ("stride_ob", "stride_oh", "stride_dob", "stride_doh", "N_QUERIES",
                            "HEAD_DIM")
GRADIENT_UNSPECIALIZED = _SCALARS + tuple(
    f"stride_{t}{d}" for t in ("q", "k", "v", "do", "l", "dk", "dv", "dq") for d in "bh")


@triton.jit(do_not_specialize=PREPROCESS_UNSPECIALIZED)
def bwd_preprocess_kernel(
    O, DO, Delta,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    N_QUERIES, HEAD_DIM,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_b = tl.program_id(2)

    o_base = O + pid_b.to(tl.int64) * stride_ob + pid_h.to(tl.int64) * stride_oh
    do_base = DO + pid_b.to(tl.int64) * stride_dob + pid_h.to(tl.int64) * stride_doh
    # Delta is our own contiguous (B, H, N) fp32 buffer.
    delta_base = Delta + (pid_b.to(tl.int64) * tl.num_programs(1) + pid_h) * N_QUERIES

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < N_QUERIES
    mask = mask_m[:, None] & (offs_d < HEAD_DIM)[None, :]

    # Upcast before multiplying: fp32 products, and the interpreter's bf16 arithmetic is wrong.
    o = tl.load(o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                 mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, axis=1)
    tl.store(delta_base + offs_m, delta, mask=mask_m)


@triton.jit(do_not_specialize=[n for n in GRADIENT_UNSPECIALIZED if not n.startswith("stride_dq")])
def bwd_dkdv_kernel(
    Q, K, V, DO, L, Delta, DK, DV,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_lb, stride_lh, stride_lm,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    N_QUERIES, N_KEYS, HEAD_DIM, GROUP_SIZE, CAUSAL_SHIFT, LEFT_SHIFT,
    scale, softcap,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_hkv = tl.program_id(1)
    pid_b = tl.program_id(2)
    heads = tl.num_programs(1) * GROUP_SIZE

    k_base = K + pid_b.to(tl.int64) * stride_kb + pid_hkv.to(tl.int64) * stride_kh
    v_base = V + pid_b.to(tl.int64) * stride_vb + pid_hkv.to(tl.int64) * stride_vh

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_n = offs_n < N_KEYS
    mask_d = offs_d < HEAD_DIM

    # K and V of this key block stay on chip for the whole program. Padding reads as 0.
    kv_mask = mask_n[:, None] & mask_d[None, :]
    k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=kv_mask, other=0.0)
    v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=kv_mask, other=0.0)

    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)

    # Causal block skipping: query i sees key j iff i >= j - CAUSAL_SHIFT, so no query before
    # pid_n * BLOCK_N - CAUSAL_SHIFT sees this block; start at the query block holding that row.
    lo = 0
    if IS_CAUSAL:
        lo = (tl.maximum(pid_n * BLOCK_N - CAUSAL_SHIFT, 0) // BLOCK_M) * BLOCK_M
    # A left edge: query i sees key j only if i <= j - LEFT_SHIFT, so no query from the block's
    # last key - LEFT_SHIFT + 1 on sees it: the loop ends there.
    hi = N_QUERIES
    if HAS_LEFT:
        hi = tl.minimum(pid_n * BLOCK_N + BLOCK_N - LEFT_SHIFT, N_QUERIES)

    # Every query head of the GQA group adds into the same dk, dv: they are the group's sums.
    for g in range(GROUP_SIZE):
        pid_h = pid_hkv * GROUP_SIZE + g
        q_base = Q + pid_b.to(tl.int64) * stride_qb + pid_h.to(tl.int64) * stride_qh
        do_base = DO + pid_b.to(tl.int64) * stride_dob + pid_h.to(tl.int64) * stride_doh
        l_base = L + pid_b.to(tl.int64) * stride_lb + pid_h.to(tl.int64) * stride_lh
        delta_base = Delta + (pid_b.to(tl.int64) * heads + pid_h) * N_QUERIES

        # Tile pointers start at query row `lo` and advance one block per step (one add each:
        # the interpreter pays per integer op).
        offs_m = lo + offs_m0
        q_ptrs = q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
        do_ptrs = do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod
        l_ptrs = l_base + offs_m * stride_lm
        delta_ptrs = delta_base + offs_m

        for start_m in range(lo, hi, BLOCK_M):
            offs_m = start_m + offs_m0
            mask_m = offs_m < N_QUERIES
            q_mask = mask_m[:, None] & mask_d[None, :]
            q = tl.load(q_ptrs, mask=q_mask, other=0.0)
            do = tl.load(do_ptrs, mask=q_mask, other=0.0)
            lse = tl.load(l_ptrs, mask=mask_m, other=0.0)
            delta = tl.load(delta_ptrs, mask=mask_m, other=0.0)

            # Work in the transposed (key, query) frame so that P^T and dS^T come out of the
            # dots directly as the A operands of dV and dK: no transpose of a computed tile.
            s_t = tl.dot(k, tl.trans(q)) * scale                 # (BLOCK_N, BLOCK_M) fp32
            if SOFTCAP:
                t_t = variants.tanh(s_t / softcap)               # before the mask, as forward
                s_t = t_t * softcap
            keep = mask_n[:, None] & mask_m[None, :]
            if IS_CAUSAL:
                keep = keep & (offs_n[:, None] <= offs_m[None, :] + CAUSAL_SHIFT)
            if HAS_LEFT:
                keep = keep & (offs_n[:, None] >= offs_m[None, :] + LEFT_SHIFT)
            s_t = tl.where(keep, s_t, float("-inf"))
            # A row with no visible key has lse = -inf and every score masked: subtract 0 so
            # its P is exp(-inf) = 0, not exp(-inf + inf) = NaN.
            lse_safe = tl.where(lse == float("-inf"), 0.0, lse)
            p_t = tl.exp(s_t - lse_safe[None, :])

            dv = tl.dot(p_t.to(do.dtype), do, dv)                # dV += P^T dO
            dp_t = tl.dot(v, tl.trans(do))                       # dP^T = V dO^T, fp32
            ds_t = p_t * (dp_t - delta[None, :])                 # dS^T, w.r.t. scaled scores
            if SOFTCAP:
                ds_t = ds_t * (1.0 - t_t * t_t)                  # through the cap: 1 - tanh^2
            dk = tl.dot(ds_t.to(q.dtype), q, dk)                 # dK += dS^T Q (scale below)

            q_ptrs += BLOCK_M * stride_qm
            do_ptrs += BLOCK_M * stride_dom
            l_ptrs += BLOCK_M * stride_lm
            delta_ptrs += BLOCK_M

    # S = scale * Q K^T, so dK = scale * dS^T Q: applied once here instead of per block.
    dk = dk * scale

    dk_base = DK + pid_b.to(tl.int64) * stride_dkb + pid_hkv.to(tl.int64) * stride_dkh
    dv_base = DV + pid_b.to(tl.int64) * stride_dvb + pid_hkv.to(tl.int64) * stride_dvh
    tl.store(dk_base + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(dv_base + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit(do_not_specialize=[n for n in GRADIENT_UNSPECIALIZED
                                if not n.startswith(("stride_dk", "stride_dv"))])
def bwd_dq_kernel(
    Q, K, V, DO, L, Delta, DQ,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_lb, stride_lh, stride_lm,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    N_QUERIES, N_KEYS, HEAD_DIM, GROUP_SIZE, CAUSAL_SHIFT, LEFT_SHIFT,
    scale, softcap,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_b = tl.program_id(2)
    pid_hkv = pid_h // GROUP_SIZE

    q_base = Q + pid_b.to(tl.int64) * stride_qb + pid_h.to(tl.int64) * stride_qh
    do_base = DO + pid_b.to(tl.int64) * stride_dob + pid_h.to(tl.int64) * stride_doh
    l_base = L + pid_b.to(tl.int64) * stride_lb + pid_h.to(tl.int64) * stride_lh
    delta_base = Delta + (pid_b.to(tl.int64) * tl.num_programs(1) + pid_h) * N_QUERIES
    k_base = K + pid_b.to(tl.int64) * stride_kb + pid_hkv.to(tl.int64) * stride_kh
    v_base = V + pid_b.to(tl.int64) * stride_vb + pid_hkv.to(tl.int64) * stride_vh

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < N_QUERIES
    mask_d = offs_d < HEAD_DIM

    q_mask = mask_m[:, None] & mask_d[None, :]
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=q_mask, other=0.0)
    do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                 mask=q_mask, other=0.0)
    lse = tl.load(l_base + offs_m * stride_lm, mask=mask_m, other=0.0)
    delta = tl.load(delta_base + offs_m, mask=mask_m, other=0.0)
    lse_safe = tl.where(lse == float("-inf"), 0.0, lse)   # rows with no visible key: P = 0

    dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)

    # Causal block skipping: the block's last row (pid_m * BLOCK_M + BLOCK_M - 1) sees keys up
    # to that row + CAUSAL_SHIFT; later key blocks are wholly hidden. A bound <= 0 visits none.
    hi = N_KEYS
    if IS_CAUSAL:
        hi = tl.minimum(pid_m * BLOCK_M + BLOCK_M + CAUSAL_SHIFT, N_KEYS)
    # A left edge: the block's first row sees no key before pid_m * BLOCK_M + LEFT_SHIFT; start
    # at the key block holding that key (rounded DOWN).
    lo = 0
    if HAS_LEFT:
        lo = tl.maximum(pid_m * BLOCK_M + LEFT_SHIFT, 0) // BLOCK_N * BLOCK_N

    k_ptrs = k_base + (lo + offs_n0)[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = v_base + (lo + offs_n0)[:, None] * stride_vn + offs_d[None, :] * stride_vd
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        mask_n = offs_n < N_KEYS
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)

        s = tl.dot(q, tl.trans(k)) * scale                       # (BLOCK_M, BLOCK_N) fp32
        if SOFTCAP:
            t = variants.tanh(s / softcap)
            s = t * softcap
        keep = mask_m[:, None] & mask_n[None, :]
        if IS_CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + CAUSAL_SHIFT)
        if HAS_LEFT:
            keep = keep & (offs_n[None, :] >= offs_m[:, None] + LEFT_SHIFT)
        s = tl.where(keep, s, float("-inf"))
        p = tl.exp(s - lse_safe[:, None])
        dp = tl.dot(do, tl.trans(v))                             # dP = dO V^T, fp32
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq)                       # dQ += dS K (scale below)

        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn

    dq = dq * scale
    dq_base = DQ + pid_b.to(tl.int64) * stride_dqb + pid_h.to(tl.int64) * stride_dqh
    tl.store(dq_base + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=q_mask)


KERNELS = {"preprocess": bwd_preprocess_kernel, "dkdv": bwd_dkdv_kernel, "dq": bwd_dq_kernel}


def _check_like(name: str, t, shape, dtype, device) -> None:
    if not isinstance(t, torch.Tensor):
        refuse(f"type({name})", type(t).__name__, "torch.Tensor")
    if tuple(t.shape) != tuple(shape):
        refuse(f"{name}.shape", tuple(t.shape), tuple(shape))
    if t.dtype != dtype:
        refuse(f"{name}.dtype", str(t.dtype), str(dtype))
    if t.device != device:
        refuse(f"{name}.device", str(t.device), str(device))


def triton_fa2_backward(q, k, v, out, lse, dout, *, causal, scale, window=(-1, -1), softcap=0.0,
                        config=None, kernels=None):
    """Gradients (dq, dk, dv) of out = softmax(scale * q k^T, masked) v w.r.t. q, k, v.

    q, out, dout (B, Hq, Nq, D); k, v (B, Hkv, Nk, D) with Hq a multiple of Hkv; lse (B, Hq, Nq)
    float32, the forward's natural-log logsumexp (-inf for rows with no visible key). Any
    strides. causal: False / "none", True / "top_left" (j <= i), or "bottom_right"
    (j <= i + Nk - Nq); window and softcap as the forward's. dq has q's shape, dk and dv k's (summed over each GQA group), all in the
    input dtype and contiguous. config: None (default_config) or a dict over
    BACKWARD_CONFIG_SPACE. kernels: {"preprocess"|"dkdv"|"dq": kernel with the real one's
    signature}, to swap in seeded-bug variants (kernels/mutants/backward_mutants.py).
    Deterministic: two calls on the same inputs give bitwise-equal gradients.
    """
    if causal == "none":
        causal = False
    causal, scale = CAPS.check_inputs(q, k, v, causal=causal, scale=scale)
    window, softcap = CAPS.check_variants(window=window, softcap=softcap)
    if not is_interpreted() and q.device.type != "cuda":
        refuse("device", str(q.device), "cuda when compiled (set TRITON_INTERPRET=1 for CPU)")
    _check_like("out", out, q.shape, q.dtype, q.device)
    _check_like("dout", dout, q.shape, q.dtype, q.device)
    _check_like("lse", lse, q.shape[:3], torch.float32, q.device)

    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    cfg = _resolve_config(config, head_dim, q.element_size())
    block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    launch = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    padded_d = block_d(head_dim)
    upper, lower = variants.mask_edges(causal, window, seq_q, seq_k)
    chosen = dict(KERNELS, **(kernels or {}))

    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    delta = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=q.device)

    chosen["preprocess"][(triton.cdiv(seq_q, block_m), heads, batch)](
        out, dout, delta, *out.stride(), *dout.stride(), seq_q, head_dim,
        BLOCK_M=block_m, BLOCK_D=padded_d, **launch,
    )
    common = (*q.stride(), *k.stride(), *v.stride(), *dout.stride(), *lse.stride())
    sizes = (seq_q, seq_k, head_dim, heads // kv_heads, upper or 0, lower or 0, float(scale),
             softcap)
    meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=padded_d, IS_CAUSAL=upper is not None,
                HAS_LEFT=lower is not None, SOFTCAP=softcap > 0, **launch)
    chosen["dkdv"][(triton.cdiv(seq_k, block_n), kv_heads, batch)](
        q, k, v, dout, lse, delta, dk, dv, *common, *dk.stride(), *dv.stride(), *sizes, **meta,
    )
    chosen["dq"][(triton.cdiv(seq_q, block_m), heads, batch)](
        q, k, v, dout, lse, delta, dq, *common, *dq.stride(), *sizes, **meta,
    )
    return dq, dk, dv
