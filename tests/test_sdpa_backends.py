"""SDPA per backend: probed declarations, a fuzz campaign per backend, both mask forms, and the
tolerance term for an approximate final normalisation (kernels/sdpa.py, fuzzattn/tolerance.py)."""
import dataclasses
import functools
import time

import pytest
import torch

import strategies
from fuzzattn import AttentionCase, Capabilities, Implementation, tolerance
from fuzzattn.campaign import fuzz
from fuzzattn.case import DTYPES
from fuzzattn.contract import UnsupportedCaseError
from fuzzattn.inputs import materialize
from fuzzattn.judge import default_device, judge
from kernels import IMPLEMENTATIONS, sdpa

REGISTERED = {impl.name: impl for impl in sdpa.BACKEND_IMPLS}
ON_CUDA = default_device() == "cuda"


# -- probing --------------------------------------------------------------------------------------
def test_every_backend_is_either_registered_or_said_to_be_unavailable():
    assert set(REGISTERED) | set(sdpa.UNAVAILABLE) == set(sdpa.BACKENDS)
    assert not set(REGISTERED) & set(sdpa.UNAVAILABLE)
    assert set(sdpa.PROBES) == set(sdpa.BACKENDS)
    assert set(sdpa.REFUSALS) == set(REGISTERED)
    # registered with the project's implementations, and only those that run here
    names = [impl.name for impl in IMPLEMENTATIONS]
    assert all(name in names for name in REGISTERED)
    assert not any(name in names for name in sdpa.UNAVAILABLE)


def test_each_declaration_names_the_torch_and_device_it_was_probed_on():
    device = torch.cuda.get_device_name() if ON_CUDA else "cpu"
    for impl in sdpa.BACKEND_IMPLS:
        assert f"torch {torch.__version__} on {device}" in impl.description, impl.description
    for reason in sdpa.UNAVAILABLE.values():
        assert torch.__version__ in reason


def test_math_runs_everything_everywhere():
    caps = REGISTERED["sdpa_math"].caps
    assert caps.dtypes == frozenset(DTYPES)
    assert caps.head_dims is None and caps.max_head_dim == sdpa.MAX_HEAD_DIM
    assert set(caps.causal) == {"top_left", "bottom_right"}
    assert caps.gqa and caps.zero_length and caps.strides == "any"
    assert sdpa.PROBES["sdpa_math"].failed == ()


@pytest.mark.skipif(ON_CUDA, reason="a CPU build's backends")
def test_on_a_cpu_build_only_flash_and_math_run():
    # torch's CPU build has a flash kernel and the math path; EFFICIENT and cuDNN are CUDA-only
    assert set(REGISTERED) == {"sdpa_flash", "sdpa_math"}
    for name in ("sdpa_efficient", "sdpa_cudnn"):
        assert any(m in sdpa.UNAVAILABLE[name] for m in sdpa.NO_KERNEL_MESSAGES)
    flash = REGISTERED["sdpa_flash"].caps
    assert flash.dtypes == frozenset(DTYPES) and flash.gqa and flash.zero_length
    # measured on torch 2.13.0+cpu: the CPU flash kernel refuses a last dim of stride 2
    assert flash.strides in ("unit_last", "any")
    if flash.strides == "unit_last":
        assert any(probe.startswith("last_dim_strided") for probe, _ in sdpa.PROBES["sdpa_flash"].failed)


def test_probing_is_cheap():
    start = time.perf_counter()
    sdpa._register()
    assert time.perf_counter() - start < (5.0 if ON_CUDA else 1.0)


def test_a_declaration_follows_what_the_probes_saw(monkeypatch):
    """probe_backend's logic on a pretend backend: fp16 missing, odd head dims refused, is_causal
    refused only for Nq != Nk, the float mask form refused, a last dim of stride 2 refused."""
    def pretend(backend, dtype, device, *, head_dim=64, causal=False, seq_q=4, seq_k=4,
                mask_form="bool", layout="contiguous", **_):
        if dtype == "float16":
            return "RuntimeError: No available kernel (dtype)"
        if head_dim % 8:
            return "RuntimeError: No available kernel (head dim)"
        if causal == "top_left" and seq_q != seq_k:
            return "RuntimeError: No available kernel (is_causal)"
        if causal == "bottom_right" and mask_form == "float":
            return "RuntimeError: No available kernel (float mask)"
        if layout == "last_dim_strided":
            return "RuntimeError: No available kernel (stride)"
        return None

    monkeypatch.setattr(sdpa, "_run_probe", pretend)
    result = sdpa.probe_backend(sdpa.SDPBackend.FLASH_ATTENTION, "cpu")
    caps = result.caps
    assert caps.dtypes == {"float32", "bfloat16"}
    assert caps.head_dims == {d for d in sdpa.PROBE_HEAD_DIMS if d % 8 == 0}
    assert caps.causal == ("top_left",)                 # bottom-right needs both mask forms
    assert result.refused_at_call_time == ("is_causal (top_left) with Nq != Nk",)
    assert caps.strides == "unit_last" and caps.gqa and caps.zero_length

    monkeypatch.setattr(sdpa, "_run_probe", lambda *a, **k: "RuntimeError: No viable backend")
    gone = sdpa.probe_backend(sdpa.SDPBackend.CUDNN_ATTENTION, "cpu")
    assert gone.caps is None and "No viable backend" in gone.reason


# -- a campaign per backend -----------------------------------------------------------------------
def _refused_at_call_time(impl: Implementation, case: AttentionCase) -> bool:
    """Whether the backend refuses this declared case with its own error (REFUSALS): such draws
    are filtered out (Hypothesis counts them as rejected, never as passes) until the engine
    counts them itself."""
    try:
        impl(*materialize(case, default_device()).tensors(), case)
    except RuntimeError as exc:
        if any(m in str(exc) for m in sdpa.REFUSALS[impl.name]):
            return True
        raise
    return False


@pytest.mark.parametrize("impl,dtype", [pytest.param(impl, d, id=f"{impl.name}-{d}")
                                        for impl in sdpa.BACKEND_IMPLS for d in DTYPES
                                        if d in impl.caps.dtypes])
def test_each_backend_passes_a_campaign_within_its_declaration(impl, dtype):
    cases = strategies.attention_cases(impl.caps, dtype=dtype).filter(
        lambda case: not _refused_at_call_time(impl, case))
    result = fuzz(impl, cases, max_examples=30, save=False)
    assert result.passed, str(result.counterexample or result.error)


# -- mask forms -----------------------------------------------------------------------------------
MASK_CASES = [
    # the H200 cuDNN leak: masked key 4 scores far above the visible ones (values=large)
    AttentionCase(1, 1, 1, 2, 5, 128, causal="bottom_right", scale=1.0, values="large"),
    # rows with no visible key (Nq > Nk), a ragged GQA case, scores below any finite sentinel
    AttentionCase(1, 2, 1, 7, 3, 64, causal="bottom_right", values="dominant_key", seed=3),
    AttentionCase(2, 4, 2, 17, 33, 40, causal="bottom_right", values="below_sentinel", seed=5),
]


def _mask_form_params():
    for impl in (sdpa.IMPL,) + sdpa.BACKEND_IMPLS:
        if "bottom_right" not in impl.caps.causal:
            continue
        for dtype in DTYPES:
            if dtype not in impl.caps.dtypes:
                continue
            for form in sdpa.CONFIG_SPACE["mask_form"]:
                marks = []
                if ON_CUDA and impl.name == "sdpa_cudnn" and form == "bool":
                    marks = [pytest.mark.xfail(reason="FACTS.md, H200 torch 2.11: cuDNN leaks a "
                                                      "masked key through a boolean mask", strict=False)]
                yield pytest.param(impl, dtype, form, id=f"{impl.name}-{dtype}-{form}", marks=marks)


@pytest.mark.parametrize("impl,dtype,form", list(_mask_form_params()))
def test_both_mask_forms_give_the_oracles_answer(impl, dtype, form):
    configured = dataclasses.replace(impl, name=f"{impl.name}[{form}]",
                                     fn=functools.partial(impl.fn, config={"mask_form": form}))
    for case in MASK_CASES:
        case = case.replace(dtype=dtype)
        if not configured.supports(case):
            continue
        if _refused_at_call_time(configured, case):
            continue
        report = judge(configured, case)
        assert report.passed, report.describe()


def test_a_config_outside_the_space_is_refused_in_one_line():
    case = AttentionCase(1, 1, 1, 2, 3, 16, causal="bottom_right")
    q, k, v = materialize(case).tensors()
    for config, what in (({"mask_form": "additive"}, "mask_form"), ({"other": 1}, "config key"),
                         ("bool", "config")):
        with pytest.raises(UnsupportedCaseError, match=what):
            sdpa.sdpa_forward(q, k, v, causal="bottom_right", scale=0.25, config=config)


# -- tolerance: an approximate final normalisation ------------------------------------------------
def _scaled_exact(q, k, v, *, causal, scale, factor):
    """The exact answer (float64 softmax on the rounded inputs) times `factor`, rounded to q's
    dtype: a kernel whose only error is a relative one on the final normalisation."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = (q64 @ k64.transpose(-1, -2)) * scale
    if causal:      # top-left only (declared below): key j visible to query i iff j <= i
        rows, cols = torch.arange(q.shape[2])[:, None], torch.arange(k.shape[2])[None, :]
        scores = scores.masked_fill(cols > rows, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v64
    return (out * factor).to(q.dtype), torch.logsumexp(scores, dim=-1).float()


def _off_by(factor: float) -> Implementation:
    return Implementation(f"exact_times_{factor!r}", functools.partial(_scaled_exact, factor=factor),
                          Capabilities(dtypes={"float32"}, head_dims=None, gqa=True,
                                       causal=("top_left",)))


# B=1 H=2 Nq=1 Nk=1 D=96 fp32 values=zero_query_rows, the H200 case: one key, so out = v exactly
# and the reference is exact; seed 25 zeroes both query rows (score term 0) and failed the bound
# without NORM_ULPS (error 4.8e-7 against 3.9e-7 allowed).
ONE_KEY = AttentionCase(1, 2, 2, 1, 1, 96, dtype="float32", values="zero_query_rows", seed=25)


def test_two_ulps_of_normalisation_error_with_one_key_passes():
    report = judge(_off_by(1 + 2 * 2.0 ** -24), ONE_KEY, device="cpu")
    assert report.passed, report.describe()
    for seed in range(40):   # and on every draw of that case, zero rows or not
        assert judge(_off_by(1 + 2 * 2.0 ** -24), ONE_KEY.replace(seed=seed), device="cpu").passed


def test_the_normalisation_term_is_what_lets_it_pass(monkeypatch):
    monkeypatch.setattr(tolerance, "NORM_ULPS", 0.0)
    report = judge(_off_by(1 + 2 * 2.0 ** -24), ONE_KEY, device="cpu")
    assert [v.check for v in report.failures] == ["out"]


@pytest.mark.parametrize("case", [ONE_KEY, AttentionCase(2, 4, 2, 9, 33, 64, seed=7),
                                  AttentionCase(1, 2, 2, 5, 5, 16, causal="top_left", seed=1)],
                         ids=str)
def test_a_kernel_off_by_1e_4_relative_still_fails(case):
    report = judge(_off_by(1 + 1e-4), case, device="cpu")
    assert "out" in [v.check for v in report.failures], report.describe()
