"""The error-statistics check (`out_rms`) and the shape families the strategies draw on purpose."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from fuzzattn import AttentionCase
from fuzzattn.contract.dtypes import unit_roundoff
from fuzzattn.judging.error_statistics import out_rms_bound
from fuzzattn.judgement.judge import judge
from fuzzattn.run.registry import implementations, mutants
from fuzzattn.judging.tolerance import (EPS_ULPS, K_OUT, K_RMS, all_finite, out_bound,
                                       out_noise)
from fuzzattn.judging.verdict import CHECKS
from fuzzattn.strategies.lengths import MAX_CHUNK, SHAPE_FAMILIES, TILE, seq_shapes


def _tensors(shape=(2, 2, 32, 16), seed=0):
    g = torch.Generator().manual_seed(seed)
    oracle = torch.randn(shape, generator=g, dtype=torch.float64)
    reference = oracle.to(torch.bfloat16)              # one rounding: the reference's error
    return oracle, reference


# -- the rule ----------------------------------------------------------------------------------
def test_an_output_as_accurate_as_the_reference_passes():
    oracle, reference = _tensors()
    b = out_rms_bound(reference, reference, oracle)
    assert b.ok and b.statistic == pytest.approx(b.reference_statistic)
    assert b.elements == oracle.numel()


def test_an_output_with_extra_error_in_every_element_fails():
    """Pre-rounding noise of about one extra rounding in every element (uniform, up to 1.5 units
    of roundoff): the rms is well above K_RMS times the reference's, while every element stays
    within the max rule (tolerance.out_bound), the gap this check closes."""
    oracle, reference = _tensors(shape=(2, 4, 64, 64))
    g = torch.Generator().manual_seed(1)
    u = unit_roundoff(torch.bfloat16)
    noise = (torch.rand(oracle.shape, generator=g, dtype=torch.float64) * 2 - 1) * 1.5 * u * oracle.abs()
    got = (oracle + noise).to(torch.bfloat16)
    b = out_rms_bound(got, reference, oracle)
    assert not b.ok and b.ratio > 1, (b.statistic, b.allowed)
    assert out_bound(got, reference, oracle).ok


def test_tf32_fp32_kernels_get_room_for_a_second_p_rounding():
    """fp32 with TF32 matmuls: the reference's error is TF32-sized P noise and its final fp32
    rounding is negligible, so a kernel carrying twice that variance (1.41x the rms) is correct
    (tolerance.K_RMS_TF32); declared IEEE fp32, the same output fails at K_RMS. A TF32 kernel
    also has room for its weights truncated a TF32 unit apart from the reference's
    (tolerance.TF32_WEIGHT_ULPS: 2 u_mm rms A, here 2x the reference's rms), so the output that
    must fail carries 4x the reference's noise."""
    g = torch.Generator().manual_seed(2)
    oracle = torch.randn((2, 4, 64, 64), generator=g, dtype=torch.float64)
    tf32 = 2.0 ** -11
    ref_noise = torch.randn(oracle.shape, generator=g, dtype=torch.float64) * tf32 * oracle.abs()
    reference = (oracle + ref_noise).to(torch.float32)
    got = (oracle + 1.38 * torch.randn(oracle.shape, generator=g, dtype=torch.float64)
           * tf32 * oracle.abs()).to(torch.float32)
    assert out_rms_bound(got, reference, oracle, fp32_matmul="tf32").ok
    assert not out_rms_bound(got, reference, oracle, fp32_matmul="ieee").ok
    worse = (oracle + 4.0 * torch.randn(oracle.shape, generator=g, dtype=torch.float64)
             * tf32 * oracle.abs()).to(torch.float32)
    assert not out_rms_bound(worse, reference, oracle, fp32_matmul="tf32").ok


def test_an_exact_reference_leaves_room_for_one_rounding():
    """When the reference is exact (ref rms 0), one element EPS_ULPS roundings off (a rounding
    that fell the other way) passes; the same error in two elements does not."""
    oracle = torch.full((1, 1, 8, 8), 0.5, dtype=torch.float64)
    reference = oracle.to(torch.bfloat16)
    got = reference.clone()
    # The element's scale is u |out| + u32 A, with A = |out| here (no cancellation).
    step = 0.5 * (unit_roundoff(torch.bfloat16) + unit_roundoff(torch.float32)) * EPS_ULPS * 0.999
    got[0, 0, 3, 3] = 0.5 + step
    b = out_rms_bound(got, reference, oracle, margins=True)
    assert b.reference_statistic == 0 and b.statistic > 0 and b.ok, (b.statistic, b.allowed)
    got[0, 0, 4, 4] = 0.5 + step
    assert not out_rms_bound(got, reference, oracle).ok


def test_a_statistic_within_the_noise_is_decided_without_the_reference():
    """Tier by tier (tolerance.py): a statistic within the noise alone passes whatever the
    reference's error, so the reference is not asked for and the noise is what it reports; above
    it the reference is asked for once, and the verdict is the whole rule's. margins=True asks
    for it always and reports the whole allowance; the verdicts are the same."""
    asked = []

    def asking(reference):
        def on_demand():
            asked.append(1)
            return reference
        return on_demand

    def numbers(b):
        return b.ok, b.statistic, b.allowed, b.reference_statistic, b.elements

    # An exact reference, one element a rounding off: within the noise.
    oracle = torch.full((1, 1, 8, 8), 0.5, dtype=torch.float64)
    reference = oracle.to(torch.bfloat16)
    within = reference.clone()
    within[0, 0, 3, 3] = 0.5 + 0.5 * (unit_roundoff(torch.bfloat16) + unit_roundoff(torch.float32))
    b = out_rms_bound(within, asking(reference), oracle)
    assert b.ok and not asked and math.isnan(b.reference_statistic)
    whole = out_rms_bound(within, reference, oracle, margins=True)
    assert whole.ok and whole.allowed >= b.allowed and whole.reference_statistic == 0
    # A reference 2^-12 off everywhere (0.5 + 2^-12 rounds to 0.5 in bf16): a kernel as far off
    # is above the noise of 4,096 elements and within the rule; one 2^-8 off is not.
    oracle = torch.full((1, 1, 64, 64), 0.5 + 2 ** -12, dtype=torch.float64)
    reference = oracle.to(torch.bfloat16)
    for got, ok in ((reference.clone(), True), (torch.full_like(reference, 0.5 + 2 ** -8), False)):
        asked.clear()
        decided = out_rms_bound(got, asking(reference), oracle)
        assert asked == [1] and decided.ok == ok
        assert numbers(decided) == numbers(out_rms_bound(got, reference, oracle, margins=True))

    # Told the reference's dtype, the middle tier: the reference, a bf16 value, is no closer to
    # the oracle than the oracle's own rounding to bf16 (here it is exactly that rounding), so
    # K_RMS times that rounding passes the first kernel without asking for the reference.
    for got, ok in ((reference.clone(), True), (torch.full_like(reference, 0.5 + 2 ** -8), False)):
        asked.clear()
        decided = out_rms_bound(got, asking(reference), oracle, reference_dtype=torch.bfloat16)
        whole = out_rms_bound(got, reference, oracle, margins=True)
        assert decided.ok == whole.ok == ok and asked == ([] if ok else [1])
        assert decided.allowed <= whole.allowed and decided.statistic == whole.statistic


def test_the_middle_tier_never_allows_more_than_the_whole_rule():
    """The oracle's own rounding to the reference's dtype is at most the reference's error in
    every element (the rounding is to the nearest value), so the middle tier's allowance is at
    most the whole rule's, whatever the reference: here sdpa's cases in bf16 and fp16."""
    impl = implementations()["sdpa"]
    from fuzzattn.inputs.materialize import materialize
    from fuzzattn.judging.oracle import oracle as float64_oracle, same_precision_reference
    for dtype in ("bfloat16", "float16"):
        for seed_value in range(6):
            case = AttentionCase(batch=1, heads=2, kv_heads=1, seq_q=5 + seed_value, seq_k=9,
                                 head_dim=16, dtype=dtype, data_seed=seed_value)
            q, k, v = materialize(case).tensors()
            truth = float64_oracle(q, k, v, case).out
            reference = same_precision_reference(q, k, v, case).out
            rounding = (truth.to(reference.dtype).double() - truth).abs()
            assert (rounding <= (reference.double() - truth).abs()).all()
            got = impl(q, k, v, case)[0]
            tiered = out_rms_bound(got, reference, truth, reference_dtype=reference.dtype)
            whole = out_rms_bound(got, reference, truth, margins=True)
            assert tiered.ok == whole.ok and tiered.allowed <= whole.allowed


@settings(max_examples=300, deadline=None)
@given(dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       out=st.floats(-4, 4), terms=st.floats(0, 4), score=st.floats(0, 100),
       ref_ulps=st.floats(0, 64), got_ulps=st.floats(-64, 64))
def test_on_one_element_it_is_never_stricter_than_the_max_rule(dtype, out, terms, score,
                                                               ref_ulps, got_ulps):
    """n = 1: the rms is that element's error, which the max rule judges; whatever it passes,
    the rms rule passes (its floor), on every tier."""
    u = unit_roundoff(dtype)
    oracle = torch.tensor([[[[out]]]], dtype=torch.float64)
    reference = (oracle + ref_ulps * u * max(abs(out), 1e-3)).to(dtype)
    got = (oracle + got_ulps * u * max(abs(out), 1e-3)).to(dtype)
    magnitude = torch.full_like(oracle, abs(out) + terms)
    if out_bound(got, reference, oracle, score).ok:
        for margins in (False, True):
            assert out_rms_bound(got, reference, oracle, score_magnitude=score,
                                 out_magnitude=magnitude, margins=margins,
                                 reference_dtype=dtype).ok


def test_the_shared_one_element_case_passes():
    """The false positive that set the floor (CPU FLASH fp16, Nq=1, D=1, near-constant keys:
    |out| = 0.006 from terms of size ~0.85, the reference's P roundings cancelling by chance to
    4.9e-6): 3.5e-5 against a 2.4e-5 rms allowance, where the max rule allows ~1e-3."""
    oracle = torch.tensor([[[[-0.005994013942182693]]]], dtype=torch.float64)
    reference = torch.tensor([[[[-0.00598907470703125]]]], dtype=torch.float16)
    got = torch.tensor([[[[-0.00595855712890625]]]], dtype=torch.float16)
    magnitude = torch.tensor([[[[0.85]]]], dtype=torch.float64)
    assert out_bound(got, reference, oracle).ok
    b = out_rms_bound(got, reference, oracle, out_magnitude=magnitude, margins=True)
    assert b.elements == 1 and b.ok and b.allowed >= out_bound(got, reference, oracle).allowed


def test_terms_that_cancel_set_the_one_element_scale():
    """The false positive that set the A scale (sdpa fp32, Nq = 1, Nk = 43, D = 1,
    near_constant): fp32 summation rounds at the size of the terms (A), not of |out|. Rebuilt
    over 16 elements, where the max rule's floor (its noise / 4, 1.5 u32) is below the
    one-element term: |out| = 1/8 everywhere, A = 4, the reference exact, one element 32 ulps of
    |out| (8 u32) off: rms 2 u32."""
    oracle = torch.full((1, 1, 4, 4), 0.125, dtype=torch.float64)
    reference = oracle.to(torch.float32)
    got = reference.clone()
    got[0, 0, 1, 2] += 8 * 2.0 ** -24
    assert not out_rms_bound(got, reference, oracle).ok          # |out| alone as the scale
    magnitude = torch.full_like(oracle, 4.0)
    assert out_rms_bound(got, reference, oracle, out_magnitude=magnitude).ok


def test_nan_fails_and_is_located():
    oracle, reference = _tensors()
    got = reference.clone()
    got[1, 0, 5, 2] = float("nan")
    b = out_rms_bound(got, reference, oracle)
    assert not b.ok and math.isinf(b.statistic)
    assert bool(torch.isinf(b.row_ratio[1, 0, 5]))


def test_rows_with_no_visible_key_are_left_out():
    oracle, reference = _tensors(shape=(1, 1, 4, 8))
    oracle[..., 0, :] = 0.0
    reference = oracle.to(torch.bfloat16)
    empty = torch.tensor([True, False, False, False])
    b = out_rms_bound(reference, reference, oracle, empty)
    assert b.elements == 3 * 8


def test_the_host_shortcuts_leave_inputs_alone_and_still_see_every_nonfinite_entry():
    """On the host, tolerance.differences and out_rms_bound skip their masks when one float64
    sum says everything is finite (tolerance.all_finite). Unmasked, the oracle is the caller's own
    tensor: nothing may write to it. And whatever the sum says, a NaN or inf in the output fails:
    an inf and a -inf (their sum NaN), a NaN in a row that is left out (that one must not
    count)."""
    oracle, reference = _tensors()
    kept = [t.clone() for t in (oracle, reference)]
    assert out_bound(reference, reference, oracle).ok
    assert out_rms_bound(reference, reference, oracle).ok
    assert all(torch.equal(a, b) for a, b in zip(kept, (oracle, reference)))
    got = reference.clone()
    got[0, 0, 1, 1], got[1, 1, 2, 3] = float("inf"), float("-inf")
    for rule in (out_bound, out_rms_bound):
        b = rule(got, reference, oracle)
        assert not b.ok and math.isinf(b.error if rule is out_bound else b.statistic)
    empty = torch.zeros(oracle.shape[2], dtype=torch.bool)
    empty[7] = True
    oracle[..., 7, :] = 0.0
    got = oracle.to(torch.bfloat16)
    got[0, 1, 7, 0] = float("nan")
    assert out_rms_bound(got, got, oracle, empty).ok           # NaN in a row left out
    assert all_finite(oracle) and not all_finite(got) and not all_finite(torch.tensor([1e308] * 2))


def test_out_rms_is_a_named_check_after_the_max_rule():
    assert CHECKS.index("out") < CHECKS.index("out_rms") < CHECKS.index("rerun")
    assert K_RMS > 1


# -- in the engine -----------------------------------------------------------------------------
MULTI_BLOCK = AttentionCase(batch=1, heads=2, kv_heads=2, seq_q=32, seq_k=80, head_dim=32,
                            dtype="bfloat16")


@pytest.mark.parametrize("name", ["sdpa", "torch_tiled"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_real_kernels_pass_out_rms(name, dtype):
    report = judge(implementations()[name], MULTI_BLOCK.replace(dtype=dtype), device="cpu")
    verdict = next(v for v in report.verdicts if v.check == "out_rms")
    assert verdict.passed and verdict.error <= verdict.allowed, report.describe()


@pytest.mark.parametrize("name,dtype", [("mutant_acc_bf16", "bfloat16"), ("mutant_acc_fp16", "float16")])
def test_a_low_precision_accumulator_passes_the_max_rule_but_not_out_rms(name, dtype):
    report = judge(mutants()[name], MULTI_BLOCK.replace(dtype=dtype), device="cpu")
    checks = {v.check: v for v in report.verdicts}
    assert checks["out"].passed, "the max rule alone sees this one: the case no longer shows the gap"
    assert not checks["out_rms"].passed
    assert checks["out_rms"].where        # the rows carrying the excess are named


def test_accumulator_mutants_are_correct_on_other_dtypes():
    """The planted bug is "accumulator kept in the input's dtype": fp32 cases must not show it."""
    case = MULTI_BLOCK.replace(dtype="float32")
    for name in ("mutant_acc_bf16", "mutant_acc_fp16"):
        assert judge(mutants()[name], case, device="cpu").passed


# -- shape families ----------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(seq_shapes(max_len=40, max_large_len=80, allow_zero=True))
def test_each_family_draws_its_shapes(shape):
    family, nq, nk = shape
    assert family in SHAPE_FAMILIES
    assert 0 <= nq <= 80 and 0 <= nk <= 80
    if family == "decode":
        assert nq == 1 and nk >= 1
    elif family == "square":
        assert nq == nk >= 1
    elif family == "chunk":
        assert (2 <= nq <= MAX_CHUNK or TILE < nq <= 40) and nk >= 2 * nq
        assert nk > TILE or 80 <= TILE
    elif family == "tall":
        assert nq > nk >= 1
    elif family == "multi_block":
        assert nq >= 1 and nk > TILE
    elif family == "tile_edges":
        assert nq >= 1 and nk >= 1 and (nq % 16 in (0, 1, 15)) and (nk % 16 in (0, 1, 15))


def test_every_family_is_drawn():
    seen = set()

    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    @given(seq_shapes(max_len=40, max_large_len=80))
    def record(shape):
        seen.add(shape[0])

    record()
    assert seen == set(SHAPE_FAMILIES)


def test_small_limits_leave_out_the_families_that_cannot_fit():
    @settings(max_examples=50, deadline=None)
    @given(seq_shapes(max_len=2))
    def small(shape):
        assert shape[0] != "chunk" and max(shape[1:]) <= 2

    small()


@pytest.mark.parametrize("name", ["mutant_decode_ignores_causal", "mutant_chunk_wrong_alignment"])
def test_shape_family_mutants_hide_outside_their_family(name):
    """Each is correct off its family, so only a draw of that family can kill it."""
    off_family = AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=5, seq_k=5, head_dim=16,
                               causal="top_left")
    assert judge(mutants()[name], off_family, device="cpu").passed
