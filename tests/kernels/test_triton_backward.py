"""The Triton FlashAttention-2 backward against float64 autograd, and its seeded-bug mutants.

Under Triton's CPU interpreter every inner-loop step costs milliseconds, so every case is tiny
(a few 16-row blocks); together they still reach every masked edge: ragged tails in Nq, Nk and D,
Nq != Nk in both causal alignments, rows with no visible key, GQA, odd layouts, three dtypes and
several tile configurations.

The reference attention is written here on purpose (not fuzzattn.oracle): a second, independent
statement of the maths, differentiated by torch autograd in float64.
"""
from __future__ import annotations

import math

import pytest
import torch

import fuzzattn  # noqa: F401  (selects the interpreter and repairs bf16 dot before triton loads)
from fuzzattn.contract import UnsupportedCaseError
from fuzzattn.kernels.mutants.backward_mutants import BACKWARD_MUTANTS
from fuzzattn.kernels.triton_fa2 import triton_fa2_forward
from fuzzattn.kernels.triton_fa2_backward import (BACKWARD_CONFIG_SPACE, _COMPILED_DEFAULTS,
                                         config_invalid, triton_fa2_backward)

from fuzzattn.judgement.judge import default_device
from fuzzattn.triton_interpreter.backend import is_interpreted

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
DEVICE = default_device()     # compiled on a GPU, interpreted on the CPU
# Compiled, fp32 tl.dot runs in TF32, whose operands are truncated to 10 mantissa bits (measured
# on the H200, see kernels/triton_fa2.py): unit roundoff 2^-10 instead of IEEE fp32's 2^-24.
UNIT_ROUNDOFF = {F32: 2.0 ** -24 if is_interpreted() else 2.0 ** -10, BF16: 2.0 ** -8,
                 F16: 2.0 ** -11}


# -- the reference: plain masked softmax attention, float64, differentiated by autograd ----------
def mask_of(seq_q: int, seq_k: int, causal: str, device=DEVICE) -> torch.Tensor:
    """True where key j is visible to query i."""
    i = torch.arange(seq_q, device=device)[:, None]
    j = torch.arange(seq_k, device=device)[None, :]
    if causal == "none":
        return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    shift = seq_k - seq_q if causal == "bottom_right" else 0
    return j <= i + shift


def reference_attention(q, k, v, causal: str, scale: float):
    """(out, lse) with GQA by repeating kv heads (autograd then sums dk, dv over each group).

    A row with no visible key gives out 0 and lse -inf, without NaN in value or gradient: the
    max is detached (softmax does not depend on it) and replaced by 0 when -inf, and the row sum
    by 1 when 0, so exp only ever sees -inf - 0.
    """
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = scale * q @ k.transpose(-1, -2)
    s = s.masked_fill(~mask_of(q.shape[2], k.shape[2], causal), float("-inf"))
    m = s.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    out = (p @ v) / torch.where(l == 0, torch.ones_like(l), l)
    return out, (m + torch.log(l)).squeeze(-1)


# -- the tolerance --------------------------------------------------------------------------------
def error_scale(q, k, v, dout, out, causal, scale):
    """Per-element magnitudes M_dq, M_dk, M_dv that bound the kernel's rounding error / u.

    Why this shape. The kernel computes dS_ij = P_ij (dP_ij - D_i) in fp32 from P (an fp32 exp
    of fp32 scores, rounded to the input dtype before dV += P^T dO), dP (an fp32-accumulated dot
    of dtype inputs) and D = rowsum(dO * O) (from the dtype-rounded out), then rounds dS to the
    input dtype before dK += dS^T Q and dQ += dS K, and rounds each gradient once at the store.
    Each of those roundings is relative, at most u (the dtype's unit roundoff), of the quantity
    rounded; none is relative to the (possibly cancelling) difference dP_ij - D_i. So
        |err dS_ij| <~ c u P_ij (|dP_ij| + sum_d |dO_id O_id|),
    and summing over the other index with fp32 accumulation (whose own error, fp32 u times the
    length, is far below bf16/fp16's u for these lengths) gives
        |err dQ| <~ c u scale (A |K|),  |err dK| <~ c u scale (A^T |Q|),  |err dV| <~ c u |P|^T |dO|
    with A_ij = P_ij (|dP_ij| + sum_d |dO_id O_id|), plus u |g| for the final rounding. For fp32
    inputs there is no dtype rounding, and the error is that of fp32 dots and exp over a few
    dozen terms: the same bound with u = 2^-24 times a length factor.
    """
    with torch.no_grad():
        group = q.shape[1] // k.shape[1]
        kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        _, lse = reference_attention(q, k, v, causal, scale)
        s = (scale * q @ kr.transpose(-1, -2)).masked_fill(
            ~mask_of(q.shape[2], k.shape[2], causal), float("-inf"))
        lse_safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        p = torch.exp(s - lse_safe[..., None])
        dp = dout @ vr.transpose(-1, -2)
        a = p * (dp.abs() + (dout * out).abs().sum(-1, keepdim=True))

        def group_sum(t):   # (B, Hq, Nk, D) -> (B, Hkv, Nk, D), as autograd sums GQA groups
            return t.unflatten(1, (k.shape[1], group)).sum(2)

        m_dq = scale * a @ kr.abs()
        m_dk = group_sum(scale * a.transpose(-1, -2) @ q.abs())
        m_dv = group_sum(p.transpose(-1, -2) @ dout.abs())
    return m_dq, m_dk, m_dv


def tolerance_factor(dtype, q, k) -> float:
    # c = 4: the three roundings above (P, dS or D, the final store) plus one for margin; measured
    # worst ratios of the real kernel with it are ~0.2 (bf16/fp16), so a seed change cannot flip
    # a test, while every mutant is >= 16x over even in bf16. fp32 has no dtype rounding: its
    # error is fp32 accumulation over the head dim and the sequence lengths, so the worst-case
    # factor n (the longest such sum) multiplies u = 2^-24 instead.
    # Compiled fp32 is TF32: the operand truncation (UNIT_ROUNDOFF) dominates, as bf16's does.
    c = 4.0
    if dtype == F32 and is_interpreted():
        c *= max(q.shape[-1], q.shape[-2], k.shape[-2], 16)
    return c * UNIT_ROUNDOFF[dtype]


def make_inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)

    return (randn(batch, heads, seq_q, head_dim), randn(batch, kv_heads, seq_k, head_dim),
            randn(batch, kv_heads, seq_k, head_dim), randn(batch, heads, seq_q, head_dim))


def reference_gradients(q, k, v, dout, causal, scale):
    """(out in q's dtype, lse float32, (dq, dk, dv) float64, (M_dq, M_dk, M_dv)) for the kernel."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, lse = reference_attention(q64, k64, v64, causal, scale)
    grads = torch.autograd.grad(out, (q64, k64, v64), dout.double())
    scales = error_scale(q64.detach(), k64.detach(), v64.detach(), dout.double(), out.detach(),
                         causal, scale)
    return out.detach().to(q.dtype), lse.detach().float(), grads, scales


def worst_ratio(got, expected, magnitude, factor) -> float:
    """max |got - expected| / (factor * (M + |expected|) + tiny); <= 1 passes. NaN -> inf."""
    if not torch.isfinite(got).all():
        return math.inf
    allowed = factor * (magnitude + expected.abs()) + 1e-30
    return ((got.double() - expected).abs() / allowed).max().item()


def check_backward(q, k, v, dout, causal, scale, *, config=None, fn=triton_fa2_backward,
                   layouts=None):
    """Run `fn` and return {grad name: worst ratio} against float64 autograd."""
    out, lse, expected, magnitudes = reference_gradients(q, k, v, dout, causal, scale)
    args = [q, k, v, out, lse, dout]
    if layouts:
        args = [relayout(t, kind) for t, kind in zip(args, layouts)]
    got = fn(*args, causal=causal, scale=scale, config=config)
    factor = tolerance_factor(q.dtype, q, k)
    ratios = {}
    for name, g, e, m, like in zip(("dq", "dk", "dv"), got, expected, magnitudes, (q, k, v)):
        assert g.shape == like.shape and g.dtype == like.dtype, (name, g.shape, g.dtype)
        ratios[name] = worst_ratio(g, e, m, factor)
    return ratios


def relayout(t: torch.Tensor, kind: str) -> torch.Tensor:
    """The same values in another memory layout."""
    if kind == "contiguous":
        return t.contiguous()
    if kind == "transposed":          # stored (B, N, H, D): head and sequence strides swapped
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    if kind == "sliced":              # every other row of a buffer twice as long
        buf = torch.full((*t.shape[:2], 2 * t.shape[2], *t.shape[3:]), float("nan"), dtype=t.dtype,
                         device=t.device)
        buf[:, :, ::2] = t
        return buf[:, :, ::2]
    if kind == "last_dim_strided":    # stride(-1) == 2
        buf = torch.full((*t.shape, 2), float("nan"), dtype=t.dtype, device=t.device)
        buf[..., 0] = t
        return buf[..., 0]
    raise ValueError(kind)


# -- correctness against float64 ------------------------------------------------------------------
CASES = [
    # id: (B, Hq, Hkv, Nq, Nk, D, causal, dtype, config)
    pytest.param(1, 1, 1, 16, 16, 16, "none", F32, None, id="one_block_none_fp32"),
    pytest.param(2, 1, 1, 20, 37, 24, "top_left", F32, {"BLOCK_M": 16, "BLOCK_N": 32},
                 id="ragged_nq<nk_top_left_fp32_16x32"),
    pytest.param(1, 2, 2, 20, 37, 16, "bottom_right", BF16,
                 {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 1}, id="ragged_nq<nk_bottom_right_bf16_32x16"),
    pytest.param(1, 1, 1, 37, 20, 40, "top_left", F16, {"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 2},
                 id="nq>nk_top_left_fp16_32x32_D40"),
    pytest.param(1, 1, 1, 37, 20, 16, "bottom_right", F16, None, id="nq>nk_bottom_right_empty_rows_fp16"),
    pytest.param(1, 4, 2, 19, 23, 16, "bottom_right", BF16, None, id="gqa2_bottom_right_bf16"),
    pytest.param(1, 2, 1, 33, 18, 8, "none", F32, {"BLOCK_M": 64, "BLOCK_N": 16},
                 id="gqa2_none_fp32_64x16_D8"),
]


@pytest.mark.parametrize("batch,heads,kv_heads,seq_q,seq_k,head_dim,causal,dtype,config", CASES)
def test_matches_float64_autograd(batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, dtype,
                                  config):
    q, k, v, dout = make_inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, dtype)
    ratios = check_backward(q, k, v, dout, causal, 1 / math.sqrt(head_dim), config=config)
    assert max(ratios.values()) <= 1.0, ratios


def test_rows_without_a_visible_key_get_zero_gradient():
    # bottom_right with Nq = 21 > Nk = 5: queries 0..15 see no key (lse -inf, out 0).
    q, k, v, dout = make_inputs(1, 2, 1, 21, 5, 16, F32, seed=3)
    out, lse, _, _ = reference_gradients(q, k, v, dout, "bottom_right", 0.3)
    assert torch.isinf(lse[:, :, :16]).all() and torch.isfinite(lse[:, :, 16:]).all()
    dq, dk, dv = triton_fa2_backward(q, k, v, out, lse, dout, causal="bottom_right", scale=0.3)
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all()
    assert (dq[:, :, :16] == 0).all()
    # Those rows carry dout but must add nothing to dk, dv: zeroing their dout changes nothing.
    dout_cut = dout.clone()
    dout_cut[:, :, :16] = 0
    _, dk_cut, dv_cut = triton_fa2_backward(q, k, v, out, lse, dout_cut, causal="bottom_right",
                                            scale=0.3)
    assert torch.equal(dk, dk_cut) and torch.equal(dv, dv_cut)
    ratios = check_backward(q, k, v, dout, "bottom_right", 0.3)
    assert max(ratios.values()) <= 1.0, ratios


@pytest.mark.parametrize("layouts", [
    # q, k, v, out, lse, dout
    pytest.param(("transposed", "sliced", "last_dim_strided", "sliced", "contiguous", "transposed"),
                 id="transposed_q_sliced_k_strided_last_v"),
    pytest.param(("sliced", "transposed", "transposed", "last_dim_strided", "contiguous", "sliced"),
                 id="sliced_q_transposed_kv"),
])
def test_layouts(layouts):
    q, k, v, dout = make_inputs(2, 2, 1, 18, 21, 16, F16, seed=1)
    ratios = check_backward(q, k, v, dout, "top_left", 0.25, layouts=layouts,
                            config={"BLOCK_M": 16, "BLOCK_N": 32})
    assert max(ratios.values()) <= 1.0, ratios


def test_lse_layout_and_stride0_broadcast_kv_dout():
    # k, v broadcast from one kv head to two (stride 0 on the head dim); lse sliced from a wider
    # buffer. The gradients are those of the (B, Hkv, Nk, D) views, as autograd gives them.
    # dout broadcast over heads too (stride 0), as from out.sum(dim=1).backward().
    q, k1, v1, dout = make_inputs(1, 4, 1, 17, 17, 16, BF16, seed=2)
    k, v = k1.expand(1, 2, 17, 16), v1.expand(1, 2, 17, 16)
    dout = dout[:, :1].expand_as(dout)
    assert k.stride(1) == 0 and dout.stride(1) == 0
    out, lse, expected, magnitudes = reference_gradients(q, k, v, dout, "top_left", 0.25)
    lse_wide = torch.full((1, 4, 34), float("nan"), device=DEVICE)
    lse_wide[:, :, ::2] = lse
    got = triton_fa2_backward(q, k, v, out, lse_wide[:, :, ::2], dout, causal=True, scale=0.25)
    factor = tolerance_factor(BF16, q, k)
    for g, e, m in zip(got, expected, magnitudes):
        assert g.shape == e.shape
        assert worst_ratio(g, e, m, factor) <= 1.0


# The tile size these tests reason with (compiled, the default tiles are larger: 64 x 64).
TILES_16 = {"BLOCK_M": 16, "BLOCK_N": 16}


def test_hidden_blocks_are_never_loaded():
    # Causal block skipping, shown with NaN poison: a masked element still enters the dots
    # (p = 0 but dp = dO V^T is NaN, and 0 * NaN = NaN), so only a block that is never loaded
    # can hold NaN without reaching the gradients. 16x16 tiles, top_left.
    # dQ pass: Nq = 16, Nk = 48; keys 16..47 are visible to no query, so after poisoning them
    # dq must equal, bitwise, the dq of the same problem cut to its first 16 keys.
    q, k, v, dout = make_inputs(1, 1, 1, 16, 48, 16, F32, seed=6)
    out, lse, _, _ = reference_gradients(q, k, v, dout, "top_left", 0.25)
    k[:, :, 16:], v[:, :, 16:] = float("nan"), float("nan")
    dq, dk, dv = triton_fa2_backward(q, k, v, out, lse, dout, causal="top_left", scale=0.25,
                                     config=TILES_16)
    dq_cut, _, _ = triton_fa2_backward(q, k[:, :, :16], v[:, :, :16], out, lse, dout,
                                       causal="top_left", scale=0.25, config=TILES_16)
    assert torch.equal(dq, dq_cut)
    # dK/dV pass: Nq = Nk = 32; query rows 0..15 cannot see keys 16..31, so poisoning their q
    # and dout must leave dk, dv of keys 16..31 finite and unchanged.
    q, k, v, dout = make_inputs(1, 1, 1, 32, 32, 16, F32, seed=7)
    out, lse, _, _ = reference_gradients(q, k, v, dout, "top_left", 0.25)
    _, dk, dv = triton_fa2_backward(q, k, v, out, lse, dout, causal="top_left", scale=0.25,
                                    config=TILES_16)
    q[:, :, :16], dout[:, :, :16] = float("nan"), float("nan")
    _, dk_p, dv_p = triton_fa2_backward(q, k, v, out, lse, dout, causal="top_left", scale=0.25,
                                        config=TILES_16)
    assert torch.equal(dk_p[:, :, 16:], dk[:, :, 16:]) and torch.equal(dv_p[:, :, 16:], dv[:, :, 16:])


def test_deterministic_bitwise():
    q, k, v, dout = make_inputs(1, 4, 2, 35, 29, 16, BF16, seed=4)
    out, lse, _, _ = reference_gradients(q, k, v, dout, "bottom_right", 0.25)
    first = triton_fa2_backward(q, k, v, out, lse, dout, causal="bottom_right", scale=0.25)
    second = triton_fa2_backward(q, k, v, out, lse, dout, causal="bottom_right", scale=0.25)
    for a, b in zip(first, second):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


# -- refusals and configuration -------------------------------------------------------------------
def _args(dtype=F32, head_dim=16):
    q, k, v, dout = make_inputs(1, 1, 1, 4, 4, head_dim, dtype)
    return [q, k, v, q.clone(), torch.zeros(1, 1, 4, device=DEVICE), dout]


@pytest.mark.parametrize("change,match", [
    (lambda a, kw: a.__setitem__(slice(0, 6), _args(torch.float64)), "dtype"),
    (lambda a, kw: a.__setitem__(5, a[5][:, :, :3]), "dout.shape"),
    (lambda a, kw: a.__setitem__(4, a[4].double()), "lse.dtype"),
    (lambda a, kw: a.__setitem__(3, a[3].half()), "out.dtype"),
    (lambda a, kw: a.__setitem__(slice(0, 6), _args(head_dim=320)), "head_dim"),
    (lambda a, kw: kw.update(config={"BLOCK_K": 16}), "config key"),
    (lambda a, kw: kw.update(config={"BLOCK_M": 48}), "BLOCK_M"),
    (lambda a, kw: kw.update(causal="diagonal"), "causal"),
])
def test_refuses_in_one_line(change, match):
    args, kwargs = _args(), dict(causal=False, scale=1.0)
    change(args, kwargs)
    with pytest.raises(UnsupportedCaseError, match=match) as info:
        triton_fa2_backward(*args, **kwargs)
    assert "\n" not in str(info.value)


def test_config_space_and_shared_memory_estimate():
    assert {key: choices[0] for key, choices in BACKWARD_CONFIG_SPACE.items()} == {
        "BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    assert config_invalid({}, 16) is None
    assert "shared memory" in config_invalid(
        {"BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 3}, 256)
    # bf16 halves the estimate: a config can be invalid for fp32 only.
    big = {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 2}
    assert config_invalid(big, 128) and config_invalid(big, 128, element_size=2) is None
    assert "unknown" in config_invalid({"BLOCK_K": 16}, 64)
    assert "BLOCK_M" in config_invalid({"BLOCK_M": 48}, 64)
    # Some compiled default fits every head dim and dtype.
    for head_dim in (1, 16, 64, 100, 128, 256):
        for size in (2, 4):
            assert any(config_invalid(c, head_dim, element_size=size) is None
                       for c in _COMPILED_DEFAULTS), (head_dim, size)


# -- mutants: each one differs from float64 on its case, where the real kernel passes --------------
MUTANT_CASES = {
    # name: (what the case is, kwargs for make_inputs, causal, scale, config)
    "mutant_bwd_dkdv_ignores_causal": ("one 16x16 diagonal block, top_left",
                                       dict(seq_q=16, seq_k=16), "top_left", 0.25, None),
    "mutant_bwd_delta_from_dout": ("one 16x16 block, not causal", dict(seq_q=16, seq_k=16),
                                   "none", 0.25, None),
    "mutant_bwd_ds_unscaled": ("one 16x16 block, scale 0.25", dict(seq_q=16, seq_k=16),
                               "none", 0.25, None),
    "mutant_bwd_lse_base2": ("one 16x16 block, not causal", dict(seq_q=16, seq_k=16),
                             "none", 0.25, None),
    "mutant_bwd_gqa_first_head_only": ("GQA 2 query heads on 1 kv head, 16x16",
                                       dict(heads=2, kv_heads=1, seq_q=16, seq_k=16),
                                       "none", 0.25, None),
    "mutant_bwd_dq_skips_key_block": ("Nq = Nk = 32 top_left with BLOCK_M=32 > BLOCK_N=16",
                                      dict(seq_q=32, seq_k=32), "top_left", 0.25,
                                      {"BLOCK_M": 32, "BLOCK_N": 16}),
}


# Launch bugs leave memory unwritten rather than computing wrong values: tested apart, below.
VALUE_MUTANTS = [m for m in BACKWARD_MUTANTS if m[0] != "mutant_bwd_dq_grid_floor"]


def test_every_mutant_has_a_case():
    assert sorted(MUTANT_CASES) == sorted(name for name, _, _ in VALUE_MUTANTS)


def test_dq_grid_floor_mutant_leaves_the_partial_block_unwritten():
    from fuzzattn.inputs.nan_fill import uninitialized_memory_is_nan
    backward = dict((m[0], m[2]) for m in BACKWARD_MUTANTS)["mutant_bwd_dq_grid_floor"]
    q, k, v, dout = make_inputs(1, 1, 1, 17, 16, 16, F32, seed=5)
    out, lse = triton_fa2_forward(q, k, v, causal=False, scale=0.25)
    real = triton_fa2_backward(q, k, v, out, lse, dout, causal=False, scale=0.25,
                               config=TILES_16)
    with uninitialized_memory_is_nan():      # torch.empty hands out NaN: unwritten rows show
        dq, dk, dv = backward(q, k, v, out, lse, dout, causal=False, scale=0.25,
                              config=TILES_16)
    assert torch.isnan(dq[:, :, 16:]).all() and torch.equal(dq[:, :, :16], real[0][:, :, :16])
    assert torch.equal(dk, real[1]) and torch.equal(dv, real[2])


@pytest.mark.parametrize("name,description,backward", VALUE_MUTANTS,
                         ids=[m[0] for m in VALUE_MUTANTS])
def test_mutant_differs_where_real_passes(name, description, backward):
    _, sizes, causal, scale, config = MUTANT_CASES[name]
    shape = dict(batch=1, heads=1, kv_heads=1, head_dim=16, dtype=F32) | sizes
    q, k, v, dout = make_inputs(**shape, seed=5)
    real = check_backward(q, k, v, dout, causal, scale, config=config)
    assert max(real.values()) <= 1.0, ("real kernel", real)
    planted = check_backward(q, k, v, dout, causal, scale, config=config, fn=backward)
    # Outside the tolerance by a wide margin (measured: >= 1e4x in fp32), not by a rounding hair.
    assert max(planted.values()) > 10.0, (name, description, MUTANT_CASES[name][0], planted)


def test_dq_skip_mutant_is_harmless_with_square_blocks():
    # Its bug needs BLOCK_M > BLOCK_N: with 16x16 blocks it computes the real gradients.
    backward = dict((m[0], m[2]) for m in BACKWARD_MUTANTS)["mutant_bwd_dq_skips_key_block"]
    q, k, v, dout = make_inputs(1, 1, 1, 32, 32, 16, F32, seed=5)
    ratios = check_backward(q, k, v, dout, "top_left", 0.25, fn=backward)
    assert max(ratios.values()) <= 1.0, ratios
