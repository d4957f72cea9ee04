"""Gradients judged by the engine: dO materialisation, the float64 gradient oracle, the calling
convention of both ways to offer gradients, each gradient check on a purpose-built bad backward,
and the differential property for every implementation declaring `backward`.

Budgets: the interpreted Triton backward costs about a second per small case (forward, two
backward runs, the references), so its property draws a handful of cases per dtype; the torch
implementations draw a tenth of the profile's budget. `fuzzattn mutants` and the gate fuzz
gradients further (every judged case of a backward-declaring implementation includes them).
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from fuzzattn import AttentionCase, Capabilities, Implementation
from fuzzattn.campaigns.campaign import check_case
from fuzzattn.contract import profiles
from fuzzattn.contract.case import DTYPES
from fuzzattn.gradients import backward_runs as gradient_runs
from fuzzattn.gradients.reference_gradients import oracle_gradients, same_precision_gradients
from fuzzattn.judging.oracle import oracle, same_precision_reference
from fuzzattn.inputs.materialize import as_bits, inputs_sha256, materialize, materialize_dout
from fuzzattn.judgement.judge import judge, skip_reason
from fuzzattn.inputs.nan_fill import prime_allocator
from fuzzattn.triton_interpreter.backend import is_interpreted
from fuzzattn.settings import implementations as all_implementations
from fuzzattn.kernels.sdpa import sdpa_forward
from fuzzattn.strategies import attention_cases
from fuzzattn.campaigns.compile_palette import campaign_palette


def case(seq_q=3, seq_k=5, head_dim=16, *, batch=1, heads=1, kv_heads=None, **kw) -> AttentionCase:
    return AttentionCase(batch=batch, heads=heads, kv_heads=kv_heads or heads, seq_q=seq_q,
                         seq_k=seq_k, head_dim=head_dim, **kw)


# -- dO ---------------------------------------------------------------------------------------
def test_dout_is_deterministic_nan_guarded_in_q_layout_and_leaves_qkv_alone():
    c = case(batch=2, heads=2, layout=("sliced", "contiguous", "contiguous"), data_seed=7)
    storage, dout = materialize_dout(c, "cpu")
    again = materialize_dout(c, "cpu")[1]
    assert torch.equal(as_bits(dout.contiguous()), as_bits(again.contiguous()))
    assert dout.shape == c.shape("q") and dout.stride() == materialize(c).q.stride()
    assert torch.isfinite(dout).all() and torch.isnan(storage).sum() == storage.numel() - dout.numel()
    assert not torch.equal(dout, materialize(c).q)              # its own stream, not q's values
    # q, k, v keep the bits existing fixtures pin (dO comes from a separate generator)
    assert inputs_sha256(materialize(c)) == inputs_sha256(materialize(c))
    assert not torch.equal(materialize_dout(c.replace(data_seed=8))[1], dout)


# -- the oracle -------------------------------------------------------------------------------
def _naive(q, k, v, causal, scale):
    """Textbook attention in float64 with GQA by explicit head indexing (not the oracle's code)."""
    heads, kv = q.shape[1], k.shape[1]
    idx = torch.tensor([h // (heads // kv) for h in range(heads)])
    s = (q @ k[:, idx].transpose(-1, -2)) * scale
    nq, nk = s.shape[-2:]
    if causal != "none":
        off = 0 if causal == "top_left" else nk - nq
        keep = torch.tensor([[j <= i + off for j in range(nk)] for i in range(nq)])
        s = s.masked_fill(~keep, -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return p @ v[:, idx]


@pytest.mark.parametrize("c", [case(), case(heads=4, kv_heads=2, causal="top_left", seq_q=6),
                               case(seq_q=7, seq_k=3, causal="bottom_right", heads=2, kv_heads=1),
                               case(seq_q=9, seq_k=4, causal="top_left", scale=-0.7),
                               case(heads=6, kv_heads=2, values="large", seq_k=11),
                               case(values="dominant_key", causal="bottom_right", seq_q=3),
                               case(seq_q=4, seq_k=6, generator="counter", values="zero_query_rows")],
                         ids=str)
def test_gradient_oracle_matches_textbook_autograd_gqa_summed_and_empty_rows_zero(c):
    inputs = materialize(c)
    _, dout = materialize_dout(c)
    ref = oracle_gradients(*inputs.tensors(), dout, c)
    leaves = [t.detach().double().requires_grad_() for t in inputs.tensors()]
    out = _naive(*leaves, c.causal, c.softmax_scale)
    expected = torch.autograd.grad(out, leaves, dout.double())
    for name, e in zip(("dq", "dk", "dv"), expected):
        assert torch.allclose(ref.grads[name], e, rtol=1e-10, atol=1e-12), name
        assert ref.grads[name].shape == e.shape
    if ref.empty_rows.any():
        assert (ref.grads["dq"][:, :, ref.empty_rows] == 0).all()


@pytest.mark.parametrize("c", [case(seq_q=7, seq_k=3, causal="bottom_right", heads=2, kv_heads=1,
                                    dtype="bfloat16"),
                               case(heads=6, kv_heads=2, values="large", seq_k=11)], ids=str)
def test_gradient_references_built_on_the_forward_references_are_the_same_bits(c):
    """judge_gradients hands the gradient references the forward judgement's oracle and
    same-precision reference of the same pristine inputs instead of computing them again: the
    gradient references must not change by a bit."""
    inputs = materialize(c)
    _, dout = materialize_dout(c)
    q, k, v = inputs.tensors()
    fwd, fwd_spr = oracle(q, k, v, c), same_precision_reference(q, k, v, c, magnitudes=False)
    pairs = [(oracle_gradients(q, k, v, dout, c), oracle_gradients(q, k, v, dout, c, forward=fwd)),
             (same_precision_gradients(q, k, v, dout, c),
              same_precision_gradients(q, k, v, dout, c, forward=fwd_spr))]
    for fresh, built in pairs:
        assert fresh.score_magnitude == built.score_magnitude or \
            math.isnan(fresh.score_magnitude) and math.isnan(built.score_magnitude)  # reference's
        for name in fresh.grads:
            assert torch.equal(as_bits(fresh.grads[name]), as_bits(built.grads[name])), name
        for name, terms in fresh.terms.items():
            for part in ("actual", "magnitude", "delta"):
                assert torch.equal(getattr(terms, part), getattr(built.terms[name], part))


@pytest.mark.parametrize("margins", [True, False])
def test_a_judged_case_computes_each_forward_reference_once(monkeypatch, margins):
    """With gradients, the forward's oracle and same-precision reference serve the gradient
    references too (on the host, where they are computed and judged): two forward attentions of
    the references a judged case with margins, where there were four; by default the
    same-precision one only if an error is above its noise (tolerance.py's tiers), and on this
    case of sdpa none is."""
    from fuzzattn.judging import oracle as oracle_module
    calls = []
    real = oracle_module._attend

    def counting(*args, **kwargs):
        calls.append(args[4])             # the compute dtype: float64 oracle, float32 reference
        return real(*args, **kwargs)

    monkeypatch.setattr(oracle_module, "_attend", counting)
    monkeypatch.setattr("fuzzattn.gradients.reference_gradients._attend", counting)
    c = case(seq_q=7, seq_k=5, causal="top_left")
    from fuzzattn.run.registry import implementations
    judged = judge(implementations()["sdpa"], c, "cpu", margins=margins)
    assert judged.passed and any(v.check.startswith("grad_") for v in judged.verdicts)
    assert sorted(map(str, calls)) == ["torch.float32"] * margins + ["torch.float64"]


# -- the two ways to offer gradients ----------------------------------------------------------
CAPS = Capabilities(dtypes={"float32"}, head_dims=None, causal=("top_left", "bottom_right"),
                    gqa=True, backward=True)


def _sdpa_backward(q, k, v, out, lse, dout, *, causal, scale, **config):
    """An explicit backward by autograd of SDPA (the plain-callable shape of the contract)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        o, _ = sdpa_forward(*leaves, causal=causal, scale=scale)
        return tuple(torch.autograd.grad(o, leaves, dout))


def test_explicit_backward_gets_the_forward_outputs_and_only_backward_config_keys():
    seen = {}

    def forward(q, k, v, *, causal, scale, **kw):
        seen["forward"] = kw
        return sdpa_forward(q, k, v, causal=causal, scale=scale)

    def backward(q, k, v, out, lse, dout, *, causal, scale, **kw):
        seen["backward"] = kw
        seen["out"] = out.clone()
        return _sdpa_backward(q, k, v, out, lse, dout, causal=causal, scale=scale)

    caps = dataclasses.replace(CAPS, configs=(("bwd_BLOCK", (16, 32)),))
    impl = Implementation("explicit", forward, caps, backward_fn=backward)
    judged = judge(impl, case(config=(("bwd_BLOCK", 32),)))
    assert judged.passed, judged.describe()
    assert seen["forward"] == {} and seen["backward"] == {"config": {"BLOCK": 32}}
    # a case without backward keys is valid: the backward runs its own default (no config=)
    assert judge(impl, case()).passed and seen["backward"] == {}
    # ... or the declared default_config, the same on every machine; a case's own keys win
    defaulted = Implementation("explicit", forward, dataclasses.replace(
        caps, configs=(("TILE", (16, 64)), ("bwd_BLOCK", (16, 32))),
        default_config={"TILE": 64, "bwd_BLOCK": 16}), backward_fn=backward)
    assert judge(defaulted, case()).passed
    assert seen["forward"] == {"config": {"TILE": 64}}
    assert seen["backward"] == {"config": {"BLOCK": 16}}
    assert judge(defaulted, case(config=(("bwd_BLOCK", 32),))).passed
    assert seen["forward"] == {"config": {"TILE": 64}}
    assert seen["backward"] == {"config": {"BLOCK": 32}}
    with pytest.raises(ValueError, match=r"default_config\['bwd_BLOCK'\]=48 is not a declared"):
        dataclasses.replace(caps, default_config={"bwd_BLOCK": 48})
    assert {v.check for v in judged.verdicts} >= {"grad_dq", "grad_dk", "grad_dv",
                                                   "grad_nondeterministic", "grad_inputs_mutated"}


def test_autograd_gradients_and_no_gradients_without_backward():
    impl = Implementation("autograd", sdpa_forward, CAPS)
    judged = judge(impl, case(heads=2, kv_heads=1, causal="bottom_right", seq_q=6, seq_k=4))
    assert judged.passed, judged.describe()
    assert "grad_dq" in {v.check for v in judged.verdicts}
    forward_only = Implementation("fwd", sdpa_forward, dataclasses.replace(CAPS, backward=False))
    assert not [v for v in judge(forward_only, case()).verdicts if v.check.startswith("grad_")]


# -- each gradient check on a purpose-built bad backward --------------------------------------
def _scales_dout_in_place(q, k, v, out, lse, dout, *, causal, scale):
    grads = _sdpa_backward(q, k, v, out, lse, dout, causal=causal, scale=scale)
    dout[0, 0, 0, 0] = dout[0, 0, 0, 0] * 2      # the caller's dO changes under it
    return grads


def _reads_row_past_dout(q, k, v, out, lse, dout, *, causal, scale):
    # One row past dO's end, through its storage: NaN padding in the judge, zeros when clean.
    b, h, n, d = dout.shape
    past = dout.as_strided((b, h, n + 1, d), dout.stride(), dout.storage_offset())[:, :, -1:]
    dq, dk, dv = _sdpa_backward(q, k, v, out, lse, dout, causal=causal, scale=scale)
    return dq + past.sum(), dk, dv


def _leaves_dq_tail_unwritten(q, k, v, out, lse, dout, *, causal, scale):
    dq, dk, dv = _sdpa_backward(q, k, v, out, lse, dout, causal=causal, scale=scale)
    result = torch.empty(dq.shape, dtype=dq.dtype)
    result[:, :, :-1] = dq[:, :, :-1]
    return result, dk, dv


def _noisy_dk(q, k, v, out, lse, dout, *, causal, scale):
    dq, dk, dv = _sdpa_backward(q, k, v, out, lse, dout, causal=causal, scale=scale)
    return dq, dk * (1 + torch.rand(dk.shape, device=dk.device) * 2.0 ** -23), dv


def _leaks_masked_keys(q, k, v, out, lse, dout, *, causal, scale):
    return _sdpa_backward(q, k, v, out, lse, dout, causal=False, scale=scale)


def _raises(q, k, v, out, lse, dout, *, causal, scale):
    raise RuntimeError("backward not implemented for this case")


def _wrong_shape(q, k, v, out, lse, dout, *, causal, scale):
    dq, dk, dv = _sdpa_backward(q, k, v, out, lse, dout, causal=causal, scale=scale)
    return dq, dk.repeat_interleave(2, dim=1), dv


BAD = {
    "grad_inputs_mutated": (_scales_dout_in_place, case()),
    "grad_out_of_bounds_read": (_reads_row_past_dout, case()),
    "grad_unwritten": (_leaves_dq_tail_unwritten, case()),
    "grad_nondeterministic": (_noisy_dk, case()),
    "grad_empty_rows": (_leaks_masked_keys, case(seq_q=2, seq_k=4, causal="top_left")),
    "grad_crash": (_raises, case()),
}


@pytest.mark.parametrize("check", sorted(BAD) + ["contract"])
def test_each_gradient_check_catches_its_bad_backward(check):
    fn, c = BAD.get(check, (_wrong_shape, case()))
    impl = Implementation(f"bad_{check}", sdpa_forward, CAPS, backward_fn=fn)
    judged = judge(impl, c)
    assert not judged.passed
    expected = "grad_crash" if check == "contract" else check
    assert judged.first_failure.check == expected, judged.describe()
    if check == "contract":
        assert "dk of shape" in judged.first_failure.detail


def test_forward_failure_is_reported_once_without_gradient_verdicts():
    def bad_forward(q, k, v, *, causal, scale):
        out, lse = sdpa_forward(q, k, v, causal=causal, scale=scale)
        return out * 2, lse

    judged = judge(Implementation("bad_fwd", bad_forward, CAPS), case())
    assert judged.first_failure.check == "out"
    assert not [v for v in judged.verdicts if v.check.startswith("grad_")]


# -- the differential property for gradients --------------------------------------------------
def _budget(impl: Implementation) -> int:
    if impl.backend == "triton" and is_interpreted():
        return 4                     # ~1-2 s per case under the interpreter, forward + 2 backwards
    return max(8, profiles.active().max_examples // 10)


GRAD_PARAMS = [pytest.param(impl, dtype, id=f"{impl.name}-{dtype}")
               for impl in all_implementations() if impl.caps.backward
               for dtype in DTYPES if dtype in impl.caps.dtypes]


@pytest.mark.parametrize("impl,dtype", GRAD_PARAMS)
def test_gradients_match_oracle(impl, dtype):
    @settings(max_examples=_budget(impl))
    @given(data=st.data())
    def gradients(data):
        # Compiled kernels draw from a compile palette, as their campaigns do: each new
        # configuration or shape is a compile, which would be most of the test's time.
        c = data.draw(attention_cases(impl.caps, dtype=dtype, palette=campaign_palette(impl, 0)),
                      label="case")
        reason = skip_reason(impl, c)
        if reason is not None:
            pytest.skip(reason)
        check_case(impl, c)

    gradients()


def test_a_gradient_past_the_dtype_range_is_right_as_inf():
    """fp16 dk of a below_sentinel case is ~8e4 exactly, past fp16's 65504: inf is its correct
    rounding (found on the H200 as a false grad_nonfinite of sdpa_math; regressions/016e68cd71a9.json
    replays the case on every implementation). A finite or wrong-signed stand-in is not."""
    from fuzzattn.gradients.gradient_verdicts import _overflows
    exact = torch.tensor([8e4, -8e4, 100.0, 8e4], dtype=torch.float64)
    got = torch.tensor([float("inf"), float("-inf"), 100.0, 65504.0], dtype=torch.float16)
    assert _overflows(got, exact).tolist() == [True, True, False, False]
    assert not _overflows(-got, exact)[:2].any()
    from fuzzattn.campaigns.regression_file import load
    from pathlib import Path
    record = load(Path(__file__).resolve().parents[2] / "regressions" / "016e68cd71a9.json")
    fresh = materialize(record.case, "cpu")
    _, dout = materialize_dout(record.case, "cpu")
    dk = oracle_gradients(*fresh.tensors(), dout, record.case).grads["dk"]
    assert bool((dk.abs() > torch.finfo(torch.float16).max).any())
    from fuzzattn.run.registry import implementations
    assert judge(implementations()["sdpa_math"], record.case).passed


def test_gradients_the_rule_cannot_bound_are_not_judged():
    """Scores of ~1e8 in fp16: the recomputation term of the gradient rule is past fp16's range,
    so inf from a recomputing backward (SDPA's CPU flash backward on this file's case) is not a
    failure, while the same rule keeps bounding the gradients of ordinary values."""
    from pathlib import Path
    from fuzzattn.campaigns.regression_file import load
    from fuzzattn.gradients.reference_gradients import oracle_gradients
    from fuzzattn.judging.tolerance import grad_allowance
    record = load(Path(__file__).resolve().parents[2] / "regressions" / "fcde2197009b.json")
    for case, vacuous in ((record.case, True), (record.case.replace(values="normal"), False)):
        fresh = materialize(case, "cpu")
        _, dout = materialize_dout(case, "cpu")
        ref = oracle_gradients(*fresh.tensors(), dout, case)
        allowance = grad_allowance(torch.float16, ref.terms["dv"],
                                   score_magnitude=ref.score_magnitude, terms_summed=case.seq_q)
        assert (allowance >= torch.finfo(torch.float16).max) == vacuous, (case, allowance)
    from fuzzattn.run.registry import implementations
    assert judge(implementations()["sdpa"], record.case).passed


_CACHE: dict = {}


def _caching(q, k, v, *, causal, scale):
    """Correct attention that keeps the boolean mask of hidden keys across calls, as real
    kernels keep masks and workspaces, and hands it to masked_fill, which autograd saves."""
    n, m = q.shape[2], k.shape[2]
    key = (n, m, causal, str(q.device))
    if key not in _CACHE:
        offset = 0 if causal in (False, "top_left") else m - n
        visible = torch.ones(n, m, dtype=torch.bool, device=q.device)
        _CACHE[key] = ~(visible.tril(offset) if causal else visible)
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    s = s.masked_fill(_CACHE[key], float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (p @ v.float()).to(q.dtype), lse


def test_a_kernel_caching_tensors_across_calls_is_judged_as_it_runs():
    """The judge's references and checks run in inference mode, the implementation never:
    a mask cached by the forward's run and saved by autograd in the gradients' run is an
    ordinary tensor (run in inference mode, the backward raised "Inference tensors cannot be
    saved for backward": a grad_crash of the harness's making)."""
    _CACHE.clear()
    impl = Implementation(name="caching", fn=_caching, caps=CAPS,
                          description="keeps its masks across calls")
    for causal in ("top_left", "bottom_right"):
        judged = judge(impl, AttentionCase(1, 2, 2, 9, 12, 16, causal=causal), "cpu")
        assert judged.passed, judged.describe()
        assert any(v.check == "grad_dq" for v in judged.verdicts)


def test_an_unwritten_gradient_is_named_so_whatever_the_heap_hands_back(monkeypatch):
    """The attribution's clean re-runs zero every tensor the backward allocates
    (UninitializedMemoryIsZero), so a NaN block the heap hands back cannot make an unwritten dq
    read as grad_nonfinite. Here every priming, the clean re-runs' included, hands the allocator
    freed NaN blocks of the gradients' sizes: the heap a full suite run left once."""
    monkeypatch.setattr(gradient_runs, "_prime", lambda case, device, byte: prime_allocator(
        gradient_runs._gradient_bytes(case), device, 0xFF))
    fn, c = BAD["grad_unwritten"]
    impl = Implementation("bad_grad_unwritten", sdpa_forward, CAPS, backward_fn=fn)
    for _ in range(5):
        assert judge(impl, c).first_failure.check == "grad_unwritten"
