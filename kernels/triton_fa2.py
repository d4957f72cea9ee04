"""FlashAttention-2 forward in Triton: the article's kernel grown into a tunable one.

One program per (query tile, head, batch): fp32 running state (m, l, acc), online softmax, and
L = logsumexp (natural log) of the scaled, masked scores. Both of the article's fixes are in
place: keys past N_KEYS are masked out of the softmax, and the P cast is assigned
(`p = p.to(v.dtype)`) before the second dot.

Configurations (kernels/triton_fa2_configs.py): one choice per axis of CONFIG_SPACE, the
article's kernel first. `config=...` pins one (any point of the space runs); `config=None` is
autotuned over AUTOTUNE_CONFIGS compiled and runs BASELINE_CONFIG interpreted.
examples/square_fp16_attention.py shows the other recipe, `fuzzattn.contract.autotune`.

What a production kernel does, each for a reason (comments at each place say more):
* Both causal alignments: top-left (key j visible to query i iff j <= i) and bottom-right
  (j <= i + Nk - Nq, FlashAttention >= 2.1); rows that see no key end as out 0, lse -inf.
* A sliding window and a softcap (kernels/triton_fa2_variants.py), as FlashAttention-2's.
* Block skipping in stages: key blocks visible to every row of the tile run without a mask; the
  blocks across the window's left edge, the diagonal and the ragged end run with their masks;
  key blocks hidden from every row are never loaded.
* exp2 with the softmax scale folded into log2(e); lse is converted back to natural log.
* p = exp2(min(s - m, 0)): p <= 1 however the compiler contracts s - m, so the cast of P to
  fp16 cannot overflow.
* Key blocks wholly inside Nk load without bounds masks; only a ragged last block pays for them.
* Packed ragged batches (VARLEN; kernels/triton_fa2_varlen.py launches them): each program reads
  its sequence's offsets on the device and masks by that sequence's own lengths.

Kept from the article's port:
* Offsets + masks, not `tl.make_block_ptr` (removed in triton 3.9, broken in 3.8's interpreter).
* (B, H, N, D) tensors with every stride honoured (the last dim too): transposed, sliced and
  stride-0 broadcast inputs work without a copy. GQA: query head h reads kv head h // (Hq // Hkv).
* D is padded to a power-of-two BLOCK_D >= 16 with masked loads, so any D up to 256 works.
* Masked scores are -inf (the article's -1e6 lets masked keys out-vote real scores below it),
  with a safe max: a row that has seen no key computes exp2(-inf - 0) = 0, not NaN.
* int64 (batch, head) base offsets; out / lse written into caller buffers when given.

fp32 inputs use tl.dot's default precision: IEEE fp32 in the interpreter; TF32 compiled on CUDA,
operands truncated to 10 mantissa bits (docs/CALIBRATION.md#tf32).

Seeded-bug variants (kernels/mutants/) are this file's kernel with one source edit and the same
signature; they reuse this launcher through `triton_fa2_forward(..., kernel=...)`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fuzzattn.contract import Capabilities, Implementation, refuse
from fuzzattn.triton_interpreter.backend import ensure_backend, is_interpreted
from fuzzattn.kernels import triton_fa2_configs, triton_fa2_launch, triton_fa2_variants as variants
from fuzzattn.kernels.triton_fa2_backward import triton_fa2_backward
from fuzzattn.kernels.triton_fa2_launch import launch, output_buffer
# The configuration space is part of this kernel's interface: its names are re-exported here.
from fuzzattn.kernels.triton_fa2_configs import (  # noqa: F401
    ALL_CONFIGS, AUTOTUNE_CONFIGS, BACKWARD_CONFIGS, BASELINE_CONFIG, CONFIG_SPACE, MAX_HEAD_DIM,
    KNOWN_DEFECTS, autotuned, block_d, config_invalid, config_problem, forward_and_backward_rule)

# Idempotent; kernels/__init__.py already called it, but importing this module directly must also
# decorate the kernels below under the right backend.
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
    window=True,                     # both edges and causal: kernels/triton_fa2_variants.py
    softcap=True,
    backward=True,                   # triton_fa2_backward (kernels/triton_fa2_backward.py)
    # tl.dot's default for fp32 operands: TF32 on tensor cores compiled, IEEE in the interpreter.
    fp32_matmul="ieee" if is_interpreted() else "tf32",
    deterministic=True,              # no atomics: every program owns its output rows
    out_buffer=True,
    deterministic_backward=True,     # dq in a second pass, no atomics (see the backward's docstring)
    # The configuration is drawn per case like a size (first choices: the article's 16x16
    # kernel), recorded in regression files and replayed pinned; invalid tiles are never drawn.
    # Keys starting with bwd_ configure the backward (see BACKWARD_CONFIGS).
    configs={**CONFIG_SPACE, **dict(BACKWARD_CONFIGS)},
    config_rule=forward_and_backward_rule,
    # A case naming no configuration runs the article's tiles in both passes, compiled or
    # interpreted: a configless file or case replays the same tiles on every machine, where the
    # autotuner's pick would differ by machine and could hide a tile-bound bug.
    default_config={**BASELINE_CONFIG, "bwd_BLOCK_M": 16, "bwd_BLOCK_N": 16, "bwd_num_warps": 4,
                    "bwd_num_stages": 1},
    known_defects=KNOWN_DEFECTS,     # CUDA only: a tile the compiler gets wrong
)


@triton.jit
def _attend_key_blocks(
    acc, l_i, m_i, q,
    k_base, v_base, offs_m, offs_n, offs_d, mask_d,
    start, stop, N_KEYS, CAUSAL_SHIFT, LEFT_SHIFT, qk_scale, softcap,
    stride_kn, stride_kd, stride_vn, stride_vd,
    BLOCK_N: tl.constexpr,
    CAUSAL_MASK: tl.constexpr,
    BOUNDS_MASK: tl.constexpr,
    LEFT_MASK: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """Online softmax over the key blocks starting at start, start + BLOCK_N, ... < stop.

    CAUSAL_MASK: hide key j from row i when j > i + CAUSAL_SHIFT (the diagonal blocks).
    BOUNDS_MASK: the blocks may reach past N_KEYS (the ragged last block): mask loads and scores.
    LEFT_MASK: hide key j from row i when j < i + LEFT_SHIFT (a window's left edge).
    Without any, every key of every block is real and visible: no mask is computed at all.
    Scores are in base-2 units (qk_scale includes log2 e), so m_i is too; with SOFTCAP, qk_scale
    is scale / softcap and softcap is the cap times log2 e (the launcher folds both).
    """
    k_ptrs = k_base + (start + offs_n)[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = v_base + (start + offs_n)[:, None] * stride_vn + offs_d[None, :] * stride_vd
    for start_n in range(start, stop, BLOCK_N):
        offs_kn = start_n + offs_n
        if BOUNDS_MASK:
            # Masked loads read 0 past N_KEYS; v must be 0 there, since 0 * NaN garbage is NaN.
            mask_n = offs_kn < N_KEYS
            k = tl.load(k_ptrs, mask=mask_n[:, None] & mask_d[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        else:
            # Fast path: the whole block is inside N_KEYS, only the head-dim padding is masked.
            k = tl.load(k_ptrs, mask=mask_d[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=mask_d[None, :], other=0.0)

        s = tl.dot(q, tl.trans(k)) * qk_scale          # (BLOCK_M, BLOCK_N), fp32, base 2
        if SOFTCAP:
            # c * tanh(x / c) in base 2, before any mask: a masked key stays -inf, not -c.
            s = variants.tanh(s) * softcap

        if CAUSAL_MASK or BOUNDS_MASK or LEFT_MASK:
            # Article fix 2: zero-padded keys past N_KEYS would score 0 and vote; mask them.
            keep = offs_kn[None, :] < N_KEYS
            if CAUSAL_MASK:
                keep = keep & (offs_kn[None, :] <= offs_m[:, None] + CAUSAL_SHIFT)
            if LEFT_MASK:
                keep = keep & (offs_kn[None, :] >= offs_m[:, None] + LEFT_SHIFT)
            s = tl.where(keep, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if CAUSAL_MASK or BOUNDS_MASK or LEFT_MASK:
            # Safe max: a row with every key so far masked has m_new = -inf; subtracting 0
            # instead gives p = exp2(-inf) = 0 and alpha = 0, never exp2(-inf + inf) = NaN.
            # Unmasked blocks score every key finitely, so they skip this select.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_safe = m_new
        # p <= 1 is what makes the fp16 cast below safe, and it holds only for the rounded s the
        # max was taken over. Compiled, s - m may be contracted into one FMA of the unrounded
        # product, so the row's own max key gives its rounding error instead of 0: up to half an
        # ulp of s, i.e. 2**32 for scores near -1e9, and p = 2**32 is inf in fp16
        # (regressions/0763cfda3c65.json). Clamping at 0 restores the bound whatever the
        # compiler contracts; NaN still propagates (a NaN score stays NaN).
        p = tl.math.exp2(tl.minimum(s - m_safe[:, None], 0.0, propagate_nan=tl.PropagateNan.ALL))
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]

        # Article fix 1: the cast must be assigned; tl.dot needs both operands in v's dtype.
        p = p.to(v.dtype)
        acc = tl.dot(p, v, acc)
        m_i = m_new

        # One add per step instead of rebuilding offsets: the interpreter pays per integer op.
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


# Compiled Triton builds a binary per class of every integer argument (1, divisible by 16, other).
# Lengths, the GQA group, the causal shift and the batch/head strides only feed per-program
# scalar arithmetic (bounds, base offsets): specialising them buys nothing and makes nearly every
# ragged shape a new compile (benchmarks/compile_variants.py). Row and element strides stay
# specialised: they shape the tile's addressing (vectorised, aligned loads).
FORWARD_UNSPECIALIZED = (
    "stride_qb", "stride_qh", "stride_kb", "stride_kh", "stride_vb", "stride_vh",
    "stride_ob", "stride_oh", "stride_lb", "stride_lh",
    "N_QUERIES", "N_KEYS", "HEAD_DIM", "GROUP_SIZE", "CAUSAL_SHIFT", "LEFT_SHIFT",
    "SEQ_UPPER_TOP", "SEQ_UPPER_DIAGONAL", "SEQ_LOWER_DIAGONAL")


@triton.jit(do_not_specialize=FORWARD_UNSPECIALIZED)
def fa2_fwd_kernel(
    Q, K, V, O, L,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_lb, stride_lh, stride_lm,
    N_QUERIES, N_KEYS, HEAD_DIM, GROUP_SIZE, CAUSAL_SHIFT, LEFT_SHIFT,
    scale, softcap,
    CU_Q, CU_K, SEQ_UPPER_TOP, SEQ_UPPER_DIAGONAL, SEQ_LOWER_DIAGONAL,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    SOFTCAP: tl.constexpr,
    VARLEN: tl.constexpr = False,
):
    # Key j is kept for row i iff i + LEFT_SHIFT <= j (HAS_LEFT) and j <= i + CAUSAL_SHIFT
    # (IS_CAUSAL: causal's diagonal or a window's right edge, whichever is nearer).
    pid_m = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_b = tl.program_id(2)
    pid_hkv = pid_h // GROUP_SIZE   # GQA: GROUP_SIZE query heads share one kv head

    # int64 base offsets: (batch, head) offsets of large tensors can pass 2**31 elements.
    q_base = Q + pid_b.to(tl.int64) * stride_qb + pid_h.to(tl.int64) * stride_qh
    k_base = K + pid_b.to(tl.int64) * stride_kb + pid_hkv.to(tl.int64) * stride_kh
    v_base = V + pid_b.to(tl.int64) * stride_vb + pid_hkv.to(tl.int64) * stride_vh
    o_base = O + pid_b.to(tl.int64) * stride_ob + pid_h.to(tl.int64) * stride_oh
    l_base = L + pid_b.to(tl.int64) * stride_lb + pid_h.to(tl.int64) * stride_lh

    start_m = pid_m * BLOCK_M       # first query row of this tile
    if VARLEN:
        # Packed sequences (kernels/triton_fa2_varlen.py): pid_b is a sequence, its rows start at
        # its cu_seqlens offsets (the batch strides are 0), and its lengths and mask edges are
        # its own: the edges come from its diagonal Nk - Nq as triton_fa2_variants.sequence_edges.
        q_start = tl.load(CU_Q + pid_b)
        k_start = tl.load(CU_K + pid_b)
        N_QUERIES = tl.load(CU_Q + pid_b + 1) - q_start
        N_KEYS = tl.load(CU_K + pid_b + 1) - k_start
        CAUSAL_SHIFT = tl.minimum(SEQ_UPPER_TOP, N_KEYS - N_QUERIES + SEQ_UPPER_DIAGONAL)
        LEFT_SHIFT = N_KEYS - N_QUERIES + SEQ_LOWER_DIAGONAL
        # A tile past its sequence's last row (max_seqlen_q sizes the grid) loads no key: its
        # stores are all masked, and it must not read the next sequence's rows.
        N_KEYS = tl.where(start_m < N_QUERIES, N_KEYS, 0)
        q_base += q_start.to(tl.int64) * stride_qm
        k_base += k_start.to(tl.int64) * stride_kn
        v_base += k_start.to(tl.int64) * stride_vn
        o_base += q_start.to(tl.int64) * stride_om
        l_base += q_start.to(tl.int64) * stride_lm
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < N_QUERIES
    mask_d = offs_d < HEAD_DIM      # BLOCK_D pads D to a power of two; the padding reads as 0

    # Loaded once; padded rows (past N_QUERIES) compute garbage that the store discards.
    q_ptrs = q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)

    # exp(scale * x) = exp2(scale * log2(e) * x): one multiply folded into the scale, and exp2 is
    # the hardware instruction (ex2.approx) that exp is built from.
    qk_scale = scale * 1.4426950408889634
    if SOFTCAP:
        # c * tanh(scale x / c) * log2 e: tanh's argument takes scale / c, log2 e goes after it.
        qk_scale = scale / softcap
        softcap = softcap * 1.4426950408889634

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)   # fp32 state for every dtype
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)

    # Keys [0, n_keys_even) come in whole BLOCK_N blocks: they load without bounds masks.
    n_keys_even = N_KEYS // BLOCK_N * BLOCK_N
    stop = N_KEYS
    if IS_CAUSAL:
        # The tile's last row sees keys up to start_m + BLOCK_M - 1 + CAUSAL_SHIFT: key blocks
        # from the next whole block on are hidden from every row and never loaded (rounded UP,
        # so the block holding that key is visited).
        last_visible = tl.maximum(start_m + BLOCK_M + CAUSAL_SHIFT, 0)
        stop = tl.minimum((last_visible + BLOCK_N - 1) // BLOCK_N * BLOCK_N, N_KEYS)
    # A left edge: the tile's first row sees no key before start_m + LEFT_SHIFT, so key blocks
    # wholly before it are skipped (rounded DOWN, so the block holding that key is visited);
    # keys from its last row's edge on are past every row's edge, so the stage with the left
    # mask ends at the first whole block there (rounded UP). The stages after it start there.
    left_end = 0
    if HAS_LEFT:
        first = tl.maximum(start_m + LEFT_SHIFT, 0) // BLOCK_N * BLOCK_N
        left_end = tl.maximum(start_m + BLOCK_M - 1 + LEFT_SHIFT, 0)
        left_end = tl.minimum((left_end + BLOCK_N - 1) // BLOCK_N * BLOCK_N, stop)
        # Stage 0, across the left edge: every mask (a narrow band may meet the diagonal and the
        # ragged end in one block).
        acc, l_i, m_i = _attend_key_blocks(
            acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, mask_d,
            first, left_end, N_KEYS, CAUSAL_SHIFT, LEFT_SHIFT, qk_scale, softcap,
            stride_kn, stride_kd, stride_vn, stride_vd,
            BLOCK_N=BLOCK_N, CAUSAL_MASK=IS_CAUSAL, BOUNDS_MASK=True, LEFT_MASK=True,
            SOFTCAP=SOFTCAP)
    if IS_CAUSAL:
        # Key j is visible to row i iff j <= i + CAUSAL_SHIFT (0 top-left, Nk - Nq bottom-right).
        # Keys [0, start_m + CAUSAL_SHIFT + 1) are visible to every row of the tile; rounded
        # DOWN to whole key blocks (BLOCK_N, not BLOCK_M: the stages step by key blocks) they
        # need no causal mask. The diagonal stage starts there.
        diag_start = tl.maximum(start_m + CAUSAL_SHIFT + 1, 0) // BLOCK_N * BLOCK_N
        full_end = tl.minimum(diag_start, n_keys_even)
        # Stage 1: whole blocks visible to every row: no mask at all.
        acc, l_i, m_i = _attend_key_blocks(
            acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, mask_d,
            left_end, full_end, N_KEYS, CAUSAL_SHIFT, LEFT_SHIFT, qk_scale, softcap,
            stride_kn, stride_kd, stride_vn, stride_vd,
            BLOCK_N=BLOCK_N, CAUSAL_MASK=False, BOUNDS_MASK=False, LEFT_MASK=False,
            SOFTCAP=SOFTCAP)
        # Stage 2: the diagonal blocks inside n_keys_even: causal mask, no bounds mask.
        acc, l_i, m_i = _attend_key_blocks(
            acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, mask_d,
            tl.maximum(full_end, left_end), tl.minimum(stop, n_keys_even), N_KEYS,
            CAUSAL_SHIFT, LEFT_SHIFT, qk_scale, softcap,
            stride_kn, stride_kd, stride_vn, stride_vd,
            BLOCK_N=BLOCK_N, CAUSAL_MASK=True, BOUNDS_MASK=False, LEFT_MASK=False,
            SOFTCAP=SOFTCAP)
    else:
        # Whole blocks without any mask, then the ragged last block (if any) with bounds masks.
        acc, l_i, m_i = _attend_key_blocks(
            acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, mask_d,
            left_end, n_keys_even, N_KEYS, CAUSAL_SHIFT, LEFT_SHIFT, qk_scale, softcap,
            stride_kn, stride_kd, stride_vn, stride_vd,
            BLOCK_N=BLOCK_N, CAUSAL_MASK=False, BOUNDS_MASK=False, LEFT_MASK=False,
            SOFTCAP=SOFTCAP)
    # Stage 3: the ragged last block, when some row sees part of it: bounds (and causal) masks.
    acc, l_i, m_i = _attend_key_blocks(
        acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, mask_d,
        tl.maximum(n_keys_even, left_end), stop, N_KEYS, CAUSAL_SHIFT, LEFT_SHIFT, qk_scale,
        softcap, stride_kn, stride_kd, stride_vn, stride_vd,
        BLOCK_N=BLOCK_N, CAUSAL_MASK=IS_CAUSAL, BOUNDS_MASK=True, LEFT_MASK=False,
        SOFTCAP=SOFTCAP)

    # Rows that saw no key (l == 0) end as out 0 and lse -inf (l = 1 there: no 0/0, no log 0).
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    # m_i and log2(l) are base 2; times ln 2 gives the natural-log lse the contract promises.
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * 0.6931471805599453)

    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])
    tl.store(l_base + offs_m * stride_lm, lse, mask=mask_m)


fa2_fwd_autotuned = autotuned(fa2_fwd_kernel)


def triton_fa2_forward(q, k, v, *, causal, scale, window=(-1, -1), softcap=0.0, out=None,
                       lse=None, config=None, kernel=None):
    """softmax(scale * q k^T) v with its logsumexp: (out (B,Hq,Nq,D), lse (B,Hq,Nq) float32).

    q (B, Hq, Nq, D); k, v (B, Hkv, Nk, D) with Hq a multiple of Hkv; any strides. causal is
    False, True (= "top_left"), "top_left" or "bottom_right"; window (left, right) and softcap
    as the README's Variants. `out` / `lse`, when given, are written in place and returned.

    `config`: a dict over CONFIG_SPACE pins it; None: the autotuner's pick compiled, and
    BASELINE_CONFIG interpreted (timing the interpreter would tune for it). `kernel` swaps in a
    kernel with fa2_fwd_kernel's signature (mutants).
    """
    causal, scale, window, softcap, config = checked_call(CAPS, q, k, v, causal, scale, window,
                                                          softcap, config)
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    out = output_buffer("out", out, q.shape, q.dtype, q.device)
    lse = output_buffer("lse", lse, q.shape[:3], torch.float32, q.device)
    upper, lower = variants.mask_edges(causal, window, seq_q, seq_k)
    args = (q, k, v, out, lse,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
            seq_q, seq_k, head_dim, heads // kv_heads,
            upper or 0, lower or 0,                         # CAUSAL_SHIFT, LEFT_SHIFT
            float(scale), softcap,
            None, None, 0, 0, 0)                            # not packed: no per-sequence edges
    meta = dict(BLOCK_D=block_d(head_dim), IS_CAUSAL=upper is not None,
                HAS_LEFT=lower is not None, SOFTCAP=softcap > 0)
    launch(kernel or fa2_fwd_kernel, (seq_q, heads, batch), args, meta, config)
    return out, lse


def checked_call(caps, q, k, v, causal, scale, window, softcap, config):
    """Refuse, in one line, what `caps` does not take; return the normalised
    (causal, scale, window, softcap, config) of a call (the interpreter's config: the baseline)."""
    causal, scale = caps.check_inputs(q, k, v, causal=causal, scale=scale)
    window, softcap = caps.check_variants(window=window, softcap=softcap)
    if not is_interpreted() and q.device.type != "cuda":
        refuse("device", str(q.device), "cuda when compiled (set TRITON_INTERPRET=1 for CPU)")
    if config is None and is_interpreted():
        config = BASELINE_CONFIG
    if config is not None:
        problem = config_problem(config)
        if problem:
            refuse("config", config, f"dicts over CONFIG_SPACE; {problem}")
        why = config_invalid(config, q.shape[-1], dtype=q.dtype)
        if why:
            refuse("config", config, f"configurations that fit head_dim={q.shape[-1]}, {q.dtype}; {why}")
    return causal, scale, window, softcap, config


IMPL = Implementation(
    name="triton_fa2",
    fn=triton_fa2_forward,
    caps=CAPS,
    description="FlashAttention-2 forward in Triton: configurable tiles (article's 16x16 baseline), "
                "autotuned when compiled, staged causal skipping (both alignments), exp2, GQA, any strides.",
    backend="triton",
    sources=(__file__, triton_fa2_configs.__file__, triton_fa2_launch.__file__,
             triton_fa2_backward.__code__.co_filename),
    backward_fn=triton_fa2_backward,
)
