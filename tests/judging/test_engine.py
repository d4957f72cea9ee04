"""Unit tests of the engine: cases, materialised inputs, the oracle, the tolerance rule."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from fuzzattn.contract.case import LAYOUTS, AttentionCase, CaseError
from fuzzattn.contract import Capabilities
from fuzzattn.inputs.materialize import guard_elements, inputs_sha256, materialize
from fuzzattn.judging.oracle import (oracle, same_precision_reference, some_row_empty,
                                   truncate_to_tf32, visibility, visible_keys)
from fuzzattn.judging.tolerance import EPS_ULPS, K_OUT, NORM_ULPS, ULP32, maxima, out_bound
from fuzzattn.judging.error_statistics import out_rms_bound
from fuzzattn.strategies import attention_cases, seq_lens, undeclared_cases

BASE = AttentionCase(batch=2, heads=2, kv_heads=1, seq_q=5, seq_k=7, head_dim=16)


# -- AttentionCase ------------------------------------------------------------------------------
@pytest.mark.parametrize("changes,message", [
    pytest.param(dict(heads=3, kv_heads=2), "heads=3 is not a multiple of kv_heads=2", id="heads=3,kv=2"),
    pytest.param(dict(dtype="float64"), "dtype='float64'", id="dtype=float64"),
    pytest.param(dict(causal="diagonal"), "causal='diagonal'", id="causal=diagonal"),
    pytest.param(dict(seq_q=-1), "seq_q=-1", id="seq_q=-1"),
    pytest.param(dict(head_dim=0), "head_dim=0", id="head_dim=0"),
    pytest.param(dict(scale=float("nan")), "scale=nan", id="scale=nan"),
    pytest.param(dict(layout=("broadcast_batch", "contiguous", "contiguous")), "layout[q]",
                 id="layout[q]=broadcast"),
    pytest.param(dict(values="huge"), "values='huge'", id="values=huge"),
])
def test_case_rejects_bad_values_naming_them(changes, message):
    with pytest.raises(CaseError, match=message.replace("[", r"\[").replace("]", r"\]")):
        BASE.replace(**changes)


def test_case_round_trips_through_json_and_has_a_stable_key():
    case = BASE.replace(layout=("transposed", "sliced", "broadcast_heads"), scale=0.5)
    assert AttentionCase.from_dict(case.to_dict()) == case
    assert case.key() == AttentionCase.from_dict(case.to_dict()).key()
    assert case.key() != BASE.key()
    assert hash(case) == hash(AttentionCase.from_dict(case.to_dict()))


@pytest.mark.parametrize("data,message", [
    ({"batch": 1}, "case.heads is missing"),
    ({**BASE.to_dict(), "colour": 1}, "case.colour is not a known field"),
    ({**BASE.to_dict(), "seq_q": "5"}, "case.seq_q='5' should be of type int"),
    ({**BASE.to_dict(), "causal": True}, "case.causal=True should be of type str"),
])
def test_case_from_dict_names_the_bad_field(data, message):
    with pytest.raises(CaseError, match=message):
        AttentionCase.from_dict(data)


def test_case_prints_compactly():
    assert str(BASE.replace(dtype="bfloat16", causal="bottom_right")) == \
        "B=2 H=2/1 Nq=5 Nk=7 D=16 bf16 causal=bottom_right data_seed=0"


# -- materialised inputs --------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_hold_the_same_values_in_different_memory(layout):
    q_layout = "contiguous" if layout.startswith("broadcast") else layout
    base = BASE.replace(kv_heads=2)          # so stride-0 over heads is visible
    case = base.replace(layout=(q_layout, layout, layout))
    plain = materialize(base)
    inputs = materialize(case)
    for name in "qkv":
        t = getattr(inputs, name)
        assert not torch.isnan(t).any(), f"{name} view must not include padding"
    if not layout.startswith("broadcast"):
        for a, b in zip(inputs.tensors(), plain.tensors()):
            assert torch.equal(a, b)
    if layout == "transposed":
        assert inputs.q.stride(1) == case.head_dim and not inputs.q.is_contiguous()
    if layout == "sliced":
        assert inputs.k.stride(2) == 2 * (case.head_dim + 3) and inputs.k.storage_offset() > guard_elements(case.head_dim)
    if layout == "broadcast_batch":
        assert inputs.k.stride(0) == 0
    if layout == "broadcast_heads":
        assert inputs.k.stride(1) == 0
    if layout == "last_dim_strided":
        assert inputs.k.stride(-1) == 2


def test_padding_is_nan_around_and_inside_storage():
    inputs = materialize(BASE.replace(layout=("sliced", "contiguous", "contiguous")))
    storage, guard = inputs.storages["q"], guard_elements(BASE.head_dim)
    assert torch.isnan(storage[:guard]).all() and torch.isnan(storage[-guard:]).all()
    # the row after each sequence end is padding
    past_end = torch.as_strided(storage, (BASE.seq_q,), (1,), inputs.q.storage_offset() + inputs.q.stride(2) // 2)
    assert torch.isnan(past_end).all()


def test_inputs_are_deterministic_and_seeded():
    assert inputs_sha256(materialize(BASE)) == inputs_sha256(materialize(BASE))
    assert inputs_sha256(materialize(BASE)) != inputs_sha256(materialize(BASE.replace(data_seed=1)))


def test_below_sentinel_scores_are_below_minus_1e6():
    case = BASE.replace(values="below_sentinel", kv_heads=2)
    inputs = materialize(case)
    scores = (inputs.q.float() @ inputs.k.float().transpose(-1, -2)) * case.softmax_scale
    assert scores.max() < -1e6


# -- oracle -------------------------------------------------------------------------------------
def test_causal_alignments():
    assert visible_keys(2, 4, "top_left").tolist() == [[1, 0, 0, 0], [1, 1, 0, 0]]
    assert visible_keys(2, 4, "bottom_right").tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert visible_keys(3, 1, "bottom_right").tolist() == [[0], [0], [1]]
    assert visible_keys(3, 3, "none") is None


@pytest.mark.parametrize("causal", ["none", "top_left"])
def test_oracle_agrees_with_sdpa_in_float64(causal):
    case = BASE.replace(heads=2, kv_heads=2, causal=causal)
    q, k, v = (t.double() for t in materialize(case).tensors())
    ref = oracle(q, k, v, case)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal == "top_left")
    torch.testing.assert_close(ref.out, sdpa, rtol=1e-12, atol=1e-12)


def test_rows_with_no_visible_key_are_zero_with_lse_minus_inf():
    case = BASE.replace(seq_q=6, seq_k=2, causal="bottom_right")
    ref = oracle(*materialize(case).tensors(), case)
    assert ref.empty_rows.tolist() == [True] * 4 + [False] * 2
    assert (ref.out[:, :, :4] == 0).all() and (ref.lse[:, :, :4] == -math.inf).all()
    assert torch.isfinite(ref.out).all() and torch.isfinite(ref.lse[:, :, 4:]).all()


@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
def test_hidden_keys_and_empty_rows_match_the_mask_for_every_pair_of_lengths(causal):
    """The value checks ask some_row_empty instead of reading the mask back (one read fewer
    on an accelerator): it must say what the mask says, for every pair of lengths."""
    for seq_q in range(0, 6):
        for seq_k in range(0, 6):
            case = BASE.replace(seq_q=seq_q, seq_k=seq_k, causal=causal)
            seen = visibility(case, "cpu")
            assert seen.some_empty == bool(seen.empty.any()) == \
                some_row_empty(seq_q, seq_k, causal), (seq_q, seq_k)
            # visibility builds the hidden keys directly: the complement of visible_keys
            mask = visible_keys(seq_q, seq_k, causal)
            if mask is None and seq_k == 0:
                mask = torch.ones(seq_q, 0, dtype=torch.bool)
            if mask is None:
                assert seen.hidden is None and not seen.empty.any()
            else:
                assert torch.equal(seen.hidden, ~mask) and torch.equal(seen.empty, ~mask.any(-1))
            assert oracle(*materialize(case).tensors(), case).some_empty == seen.some_empty


def test_tf32_truncation_keeps_ten_mantissa_bits():
    x = torch.tensor([1.0 + 2 ** -10, 1.0 + 2 ** -11 + 2 ** -12, -(1.0 + 2 ** -11), -3.0, float("inf")])
    assert truncate_to_tf32(x).tolist() == [1.0 + 2 ** -10, 1.0, -1.0, -3.0, float("inf")]


def test_tf32_reference_is_less_accurate_than_ieee():
    case = BASE.replace(seq_q=32, seq_k=64, head_dim=64, kv_heads=2)
    q, k, v = materialize(case).tensors()
    truth = oracle(q, k, v, case).out
    ieee = (same_precision_reference(q, k, v, case, "ieee").out.double() - truth).abs().max()
    tf32 = (same_precision_reference(q, k, v, case, "tf32").out.double() - truth).abs().max()
    assert tf32 > 100 * ieee


# -- tolerance ----------------------------------------------------------------------------------
def test_tolerance_is_k_times_reference_error_plus_rounding_noise():
    truth = torch.zeros(1, 1, 2, 4, dtype=torch.float64)
    reference = torch.full((1, 1, 2, 4), 1e-3)
    got = torch.zeros(1, 1, 2, 4)
    got[0, 0, 1, 2] = 2.5e-3
    b = out_bound(got, reference, truth)
    # the noise term at magnitude FLOOR = 1: output rounding plus the final normalisation's ulps
    assert b.allowed == pytest.approx(K_OUT * 1e-3 + EPS_ULPS * 2.0 ** -24 + NORM_ULPS * ULP32)
    assert not b.ok and b.row_errors[0, 0].tolist() == pytest.approx([0.0, 2.5e-3])


def test_tf32_weights_a_unit_apart_are_allowed_and_more_is_not():
    """The H200 finding behind tolerance.TF32_WEIGHT_ULPS: a one-hot row returned
    trunc(v) (1 - 2^-11), its weight read by the tensor cores as 1 - 2^-11 (an fp32 value just
    below 1, truncated to TF32), where the reference's weight exp(0) = 1 kept trunc(v). Allowed for TF32 kernels on the max and the rms rule; not
    for IEEE ones, and four TF32 units off (a weight bug) fails either way."""
    def rules(shape):
        g = torch.Generator().manual_seed(3)
        v = torch.randn(shape, generator=g)
        truth = v.double()
        reference = truncate_to_tf32(v)                 # exact weight 1, v read as TF32
        magnitude = truth.abs()                         # A = |v| on a one-hot row
        return reference, (
            lambda got, mm: out_bound(got, reference, truth, out_magnitude=magnitude,
                                      fp32_matmul=mm),
            lambda got, mm: out_rms_bound(got, reference, truth, out_magnitude=magnitude,
                                          fp32_matmul=mm))

    # One row of 16 for the max rule; 1,024 elements for the rms rule, enough that its sampling
    # factor (1.16) leaves it an edge over a single row's (3.9).
    for shape, rule in ((1, 1, 1, 16), 0), ((1, 4, 16, 16), 1):
        reference, both = rules(shape)
        one_unit = reference * (1 - 2.0 ** -11)
        four_units = reference * (1 - 2.0 ** -9)
        assert both[rule](one_unit, "tf32").ok
        assert not both[rule](one_unit, "ieee").ok
        assert not both[rule](four_units, "tf32").ok


def test_nan_never_passes_the_tolerance():
    truth = torch.zeros(1, 1, 1, 4, dtype=torch.float64)
    got = torch.tensor([[[[0.0, float("nan"), 0.0, 0.0]]]])
    assert not out_bound(got, got.nan_to_num(), truth).ok


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_reference_without_magnitudes_is_the_same_reference(dtype):
    """The forward's judgement asks the same-precision reference for no magnitudes (the
    tolerance reads the oracle's): its out and lse are the same bits, and the magnitudes it left
    out say so (NaN, None) instead of reading as zero noise."""
    case = AttentionCase(2, 4, 2, 9, 13, 24, dtype=dtype, causal="bottom_right", values="large")
    q, k, v = materialize(case).tensors()
    full = same_precision_reference(q, k, v, case)
    lean = same_precision_reference(q, k, v, case, magnitudes=False)
    assert torch.equal(full.out.view(torch.int16 if dtype == "bfloat16" else torch.int32),
                       lean.out.view(torch.int16 if dtype == "bfloat16" else torch.int32))
    assert torch.equal(full.lse, lean.lse) and torch.equal(full.empty_rows, lean.empty_rows)
    assert math.isnan(lean.score_magnitude) and lean.out_magnitude is None
    assert full.score_magnitude > 0 and full.out_magnitude is not None


def test_maxima_read_together_are_each_tensors_maximum():
    """The tolerance rules read their maxima in one transfer (a wait each on a shared GPU); the
    values are each tensor's own maximum, exactly, an empty tensor's 0."""
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(3, 7, dtype=torch.float64, generator=g), torch.empty(0),
               torch.randn(5, generator=g), torch.tensor([float("inf"), 1.0])]
    assert maxima(*tensors) == [float(tensors[0].max()), 0.0, float(tensors[2].max()), math.inf]
    assert maxima(torch.empty(0, 3)) == [0.0] and maxima() == []


# -- strategies ---------------------------------------------------------------------------------
@settings(max_examples=200)
@given(st.data())
def test_drawn_cases_stay_inside_the_declaration(data):
    caps = Capabilities(dtypes={"bfloat16"}, head_dims={32, 64}, causal=("bottom_right",),
                        strides="unit_last")
    case = data.draw(attention_cases(caps))
    assert caps.why_not(case) is None
    assert case.dtype == "bfloat16" and case.kv_heads == case.heads


@settings(max_examples=100)
@given(st.data())
def test_undeclared_cases_are_outside_the_declaration(data):
    caps = Capabilities()
    what, case = data.draw(undeclared_cases(caps))
    assert caps.why_not(case) is not None, (what, case)


@pytest.mark.parametrize("strides", ["unit_last", "contiguous"])
@settings(max_examples=40)
@given(data=st.data())
def test_an_undeclared_layout_shows_in_the_strides_an_implementation_sees(strides, data):
    """An implementation sees strides, not layout names: a layout drawn outside the declaration
    is one its tensors' strides show (not D = 1 strided, nor H = 1 or Nq = 1 transposed, which
    torch's contiguity rule cannot tell from declared ones)."""
    caps = Capabilities(strides=strides, head_dims=None, max_head_dim=4)
    what, case = data.draw(undeclared_cases(caps).filter(lambda drawn: drawn[0] == "layout"))
    assert not caps.accepts_strides(materialize(case).q), case


@pytest.mark.parametrize("kwargs,message", [
    pytest.param(dict(min_len=5, max_len=3), "min_len=5 is larger than max_len=3", id="min>max"),
    pytest.param(dict(min_len=-1), "min_len=-1", id="min<0"),
    pytest.param(dict(max_len=10, max_large_len=5), "max_large_len=5 is smaller", id="large<max"),
])
def test_seq_lens_rejects_bad_arguments(kwargs, message):
    from hypothesis.errors import InvalidArgument
    with pytest.raises(InvalidArgument, match=message):
        seq_lens(**kwargs).example()
