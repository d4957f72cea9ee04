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

Causal block skipping: the dK/dV kernel starts at the first query block that can see any key of
its block; the dQ kernel stops after the last key block its last row can see. Blocks wholly
hidden are never loaded. Causal alignment is a runtime shift: key j is visible to query i iff
j <= i + CAUSAL_SHIFT, with CAUSAL_SHIFT = 0 (top_left) or Nk - Nq (bottom_right).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fuzzattn.contract import Capabilities, refuse
from fuzzattn.triton_interpreter.backend import ensure_backend, is_interpreted
# The configuration space and its shared-memory rule: re-exported, part of this kernel's interface.
from fuzzattn.kernels.triton_fa2_configs import (  # noqa: F401
    BACKWARD_CONFIG_SPACE, MAX_HEAD_DIM, block_d, backward_config_invalid as config_invalid)

# Must precede the @triton.jit decorations below (they read TRITON_INTERPRET when they run).
ensure_backend()

# Preference order for config=None when compiled: the first one config_invalid accepts for the
# head dim and element size is used. 64x64 / 4 warps / 2 stages is FA2's usual middle ground.
_COMPILED_DEFAULTS = (
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1},
    {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
    {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
)
# The interpreter pays per op, not per byte: the smallest tiles keep tests fast there.
_INTERPRETED_DEFAULT = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}

CAPS = Capabilities(
    dtypes={"float32", "bfloat16", "float16"},
    head_dims=None,                  # any D in 1..MAX_HEAD_DIM: padded to BLOCK_D with masks
    max_head_dim=MAX_HEAD_DIM,
    causal=("top_left", "bottom_right"),
    gqa=True,
    strides="any",
    zero_length=False,
    returns_lse=True,
    backward=True,
    fp32_matmul="ieee" if is_interpreted() else "tf32",
    deterministic=True,              # no atomics: every program owns the gradient rows it writes
    out_buffer=False,
)


# As in the forward (FORWARD_UNSPECIALIZED): lengths, the group, the shift and batch/head strides
# are per-program scalars, not specialised; row and element strides are.
_SCALARS = ("N_QUERIES", "N_KEYS", "HEAD_DIM", "GROUP_SIZE", "CAUSAL_SHIFT")
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
    N_QUERIES, N_KEYS, HEAD_DIM, GROUP_SIZE, CAUSAL_SHIFT,
    scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
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

        for start_m in range(lo, N_QUERIES, BLOCK_M):
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
            keep = mask_n[:, None] & mask_m[None, :]
            if IS_CAUSAL:
                keep = keep & (offs_n[:, None] <= offs_m[None, :] + CAUSAL_SHIFT)
            s_t = tl.where(keep, s_t, float("-inf"))
            # A row with no visible key has lse = -inf and every score masked: subtract 0 so
            # its P is exp(-inf) = 0, not exp(-inf + inf) = NaN.
            lse_safe = tl.where(lse == float("-inf"), 0.0, lse)
            p_t = tl.exp(s_t - lse_safe[None, :])

            dv = tl.dot(p_t.to(do.dtype), do, dv)                # dV += P^T dO
            dp_t = tl.dot(v, tl.trans(do))                       # dP^T = V dO^T, fp32
            ds_t = p_t * (dp_t - delta[None, :])                 # dS^T, w.r.t. scaled scores
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
    N_QUERIES, N_KEYS, HEAD_DIM, GROUP_SIZE, CAUSAL_SHIFT,
    scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
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

    k_ptrs = k_base + offs_n0[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = v_base + offs_n0[:, None] * stride_vn + offs_d[None, :] * stride_vd
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        mask_n = offs_n < N_KEYS
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)

        s = tl.dot(q, tl.trans(k)) * scale                       # (BLOCK_M, BLOCK_N) fp32
        keep = mask_m[:, None] & mask_n[None, :]
        if IS_CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + CAUSAL_SHIFT)
        s = tl.where(keep, s, float("-inf"))
        p = tl.exp(s - lse_safe[:, None])
        dp = tl.dot(do, tl.trans(v))                             # dP = dO V^T, fp32
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)                       # dQ += dS K (scale below)

        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn

    dq = dq * scale
    dq_base = DQ + pid_b.to(tl.int64) * stride_dqb + pid_h.to(tl.int64) * stride_dqh
    tl.store(dq_base + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=q_mask)


KERNELS = {"preprocess": bwd_preprocess_kernel, "dkdv": bwd_dkdv_kernel, "dq": bwd_dq_kernel}


def default_config(head_dim: int, element_size: int = 4) -> dict:
    """The config used for config=None: 16x16 interpreted, else the first compiled default that
    config_invalid accepts for this head dim and element size."""
    if is_interpreted():
        return dict(_INTERPRETED_DEFAULT)
    for config in _COMPILED_DEFAULTS:
        if config_invalid(config, head_dim, element_size=element_size) is None:
            return dict(config)
    return dict(_COMPILED_DEFAULTS[-1])


def _resolve_config(config, head_dim: int, element_size: int) -> dict:
    """config=None -> the default; a dict -> every key known, every value in the space, missing
    keys filled from the default; compiled, it must also pass config_invalid."""
    resolved = default_config(head_dim, element_size)
    if config is None:
        return resolved
    if not isinstance(config, dict):
        refuse("config", config, f"None or a dict with keys from {sorted(BACKWARD_CONFIG_SPACE)}")
    for key, value in config.items():
        if key not in BACKWARD_CONFIG_SPACE:
            refuse("config key", key, sorted(BACKWARD_CONFIG_SPACE))
        if isinstance(value, bool) or value not in BACKWARD_CONFIG_SPACE[key]:
            refuse(f"config[{key!r}]", value, BACKWARD_CONFIG_SPACE[key])
    resolved.update(config)
    if not is_interpreted():
        why = config_invalid(resolved, head_dim, element_size=element_size)
        if why is not None:
            refuse("config", config, f"a config that fits an sm_90 (Hopper) block: {why}")
    return resolved


def _check_like(name: str, t, shape, dtype, device) -> None:
    if not isinstance(t, torch.Tensor):
        refuse(f"type({name})", type(t).__name__, "torch.Tensor")
    if tuple(t.shape) != tuple(shape):
        refuse(f"{name}.shape", tuple(t.shape), tuple(shape))
    if t.dtype != dtype:
        refuse(f"{name}.dtype", str(t.dtype), str(dtype))
    if t.device != device:
        refuse(f"{name}.device", str(t.device), str(device))


def triton_fa2_backward(q, k, v, out, lse, dout, *, causal, scale, config=None, kernels=None):
    """Gradients (dq, dk, dv) of out = softmax(scale * q k^T, masked) v w.r.t. q, k, v.

    q, out, dout (B, Hq, Nq, D); k, v (B, Hkv, Nk, D) with Hq a multiple of Hkv; lse (B, Hq, Nq)
    float32, the forward's natural-log logsumexp (-inf for rows with no visible key). Any
    strides. causal: False / "none", True / "top_left" (j <= i), or "bottom_right"
    (j <= i + Nk - Nq). dq has q's shape, dk and dv k's (summed over each GQA group), all in the
    input dtype and contiguous. config: None (default_config) or a dict over
    BACKWARD_CONFIG_SPACE. kernels: {"preprocess"|"dkdv"|"dq": kernel with the real one's
    signature}, to swap in seeded-bug variants (kernels/mutants/backward_mutants.py).
    Deterministic: two calls on the same inputs give bitwise-equal gradients.
    """
    if causal == "none":
        causal = False
    causal, scale = CAPS.check_inputs(q, k, v, causal=causal, scale=scale)
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
    is_causal = causal != "none"
    shift = seq_k - seq_q if causal == "bottom_right" else 0
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
    sizes = (seq_q, seq_k, head_dim, heads // kv_heads, shift, float(scale))
    meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=padded_d, IS_CAUSAL=is_causal, **launch)
    chosen["dkdv"][(triton.cdiv(seq_k, block_n), kv_heads, batch)](
        q, k, v, dout, lse, delta, dk, dv, *common, *dk.stride(), *dv.stride(), *sizes, **meta,
    )
    chosen["dq"][(triton.cdiv(seq_q, block_m), heads, batch)](
        q, k, v, dout, lse, delta, dq, *common, *dq.stride(), *sizes, **meta,
    )
    return dq, dk, dv
