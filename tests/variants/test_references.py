"""References for the attention variants: SDPA with ALiBi as an explicit float mask, SDPA on each
packed sequence (sdpa_varlen), and flex's ALiBi score_mod and document mask (flex_varlen). Each
is judged against the oracle on the same drawn cases, and a test-local copy with the variant
broken is caught.

Flex's mods are judged here through eager flex_attention: the compiled CPU template is wrong for
some lengths (kernels/flex.py, CPU_DEFECT), and a compile per drawn shape would cost minutes; the
compiled path is judged by flex's campaigns where it is registered (CUDA). The mods, the block
masks and the packing are flex's own, only the compilation is not. Eager flex rounds the
normalised weights to bf16/fp16 before P @ V, which the project's precision contract (P rounded
before its normalisation, as FlashAttention does) does not allow for (values=exact_mean, bf16,
with a block mask: rms error 3.5e-4 against 1.2e-4 allowed), so the shared draws are float32."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from fuzzattn import AttentionCase
from fuzzattn.campaigns.campaign import fuzz
from fuzzattn.campaigns.regression_file import load
from fuzzattn.contract import Implementation, profiles
from fuzzattn.contract.varlen import relengthed
from fuzzattn.judgement.judge import judge
from fuzzattn.judging.oracle import visible_keys
from fuzzattn.kernels import flex, flex_varlen, sdpa, sdpa_alibi, sdpa_varlen, sdpa_window
from fuzzattn.run.registry import implementations
from fuzzattn.strategies.cases import attention_cases

CI = profiles.PROFILES["ci"]
REGRESSIONS = Path(__file__).resolve().parents[2] / "regressions"
DRAWS = settings(max_examples=10, database=None, deadline=None,
                 suppress_health_check=list(HealthCheck))


@pytest.fixture
def eager_flex(monkeypatch):
    """flex's calls through eager flex_attention (the module docstring says why)."""
    monkeypatch.setattr(flex, "_flex", lambda: flex._api().flex_attention)


# -- declarations ----------------------------------------------------------------------------------
def test_the_sdpa_references_are_registered_declaring_their_variants():
    registered = implementations()
    assert registered.get("sdpa_alibi") is sdpa_alibi.IMPL
    # sdpa_varlen off CUDA only (kernels/__init__.py says why)
    assert registered.get("sdpa_varlen") is (None if torch.cuda.is_available() else sdpa_varlen.IMPL)
    alibi, varlen = sdpa_alibi.CAPS, sdpa_varlen.CAPS
    assert alibi.alibi and alibi.window and not alibi.softcap and not alibi.varlen
    assert varlen.varlen and varlen.window and not varlen.softcap and not varlen.alibi
    assert varlen.zero_length and varlen.backward and alibi.backward
    # Defects are declared where a campaign saw them: each pinned by a file the H200 wrote.
    assert [d.regression for d in alibi.known_defects] == [
        "3b46e3e5e539.json", "446bf219443a.json", "1c90478d5144.json", "789cff29fc89.json"]
    assert [d.regression for d in varlen.known_defects] == [
        "0a15d32e3a6d.json", "f65d7ad72b84.json", "248883c2d64e.json", "66ad3d475eba.json"]
    assert flex.CAPS.alibi and flex_varlen.CAPS.varlen and flex_varlen.CAPS.softcap
    assert [d.regression for d in flex_varlen.CAPS.known_defects] == [
        "7140b2b50fb8.json", "e362236127c9.json"]
    assert "flex_varlen" not in registered          # compile-bound: fuzzed by --impl module:NAME


@pytest.mark.parametrize("impl, regression, passed", [
    (sdpa_alibi.IMPL, "1c90478d5144.json", [dict(values="normal"), dict(causal="none"),
                                            dict(dtype="float32"), dict(alibi="standard")]),
    (sdpa_alibi.IMPL, "789cff29fc89.json", [dict(values="normal"), dict(causal="none"),
                                            dict(dtype="float32")]),
    (sdpa_varlen.IMPL, "f65d7ad72b84.json", [dict(values="normal"), dict(causal="none"),
                                             dict(dtype="float32")]),
    (sdpa_varlen.IMPL, "248883c2d64e.json", [dict(values="normal"), dict(scale=None),
                                             dict(dtype="bfloat16"), dict(dtype="float32")]),
    (sdpa_varlen.IMPL, "66ad3d475eba.json", [dict(scale=None), dict(causal="none"),
                                             dict(dtype="float32")]),
])
def test_a_cuda_defect_declared_for_a_reference_leaves_out_what_passed_there(impl, regression,
                                                                             passed):
    """Each class is no wider than its measurement: the file's case is covered on CUDA, the one
    changes that passed there (explain, or the campaign's cause) are not."""
    defect = next(d for d in impl.caps.known_defects if d.regression == regression)
    case = load(REGRESSIONS / regression).case
    assert defect.covers(case, "cuda", gradients=True)
    for change in passed:
        assert not defect.covers(case.replace(**change), "cuda", gradients=True), change


def test_the_sdpa_bias_is_the_distance_from_the_bottom_right_diagonal():
    bias = sdpa_alibi.alibi_mask(torch.tensor([0.5, 2.0]), 2, 4)
    assert bias.dtype == torch.float32
    assert bias[0].tolist() == [[-1.0, -0.5, 0.0, -0.5], [-1.5, -1.0, -0.5, 0.0]]
    assert torch.equal(bias[1], 4 * bias[0])


def test_flex_alibi_score_mod_is_the_definition_after_the_cap():
    rows, cols = torch.meshgrid(torch.arange(3), torch.arange(5), indexing="ij")
    score = torch.linspace(-9, 9, 15).view(3, 5)
    got = flex._alibi((0.25, 1.0), 2, 3.0, "cpu")(score, 0, torch.tensor(1), rows, cols)
    want = 3.0 * torch.tanh(score / 3.0) - (rows + 2 - cols).abs()
    assert torch.allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("causal,window", [("none", (-1, -1)), ("top_left", (-1, -1)),
                                           ("bottom_right", (1, 0)), ("none", (0, 2))])
def test_flex_document_mask_is_block_diagonal_and_aligned_per_sequence(causal, window):
    c = AttentionCase(batch=1, heads=1, kv_heads=1, head_dim=8, causal=causal, window=window,
                      **relengthed((3, 1, 4), (2, 5, 4)))
    mask_mod = flex_varlen.document_mask([0, 3, 4, 8], [0, 2, 7, 11], causal, window, "cpu")
    rows, cols = torch.meshgrid(torch.arange(8), torch.arange(11), indexing="ij")
    expected = torch.zeros(8, 11, dtype=torch.bool)
    for (q0, q1), (k0, k1) in zip(((0, 3), (3, 4), (4, 8)), ((0, 2), (2, 7), (7, 11))):
        block = visible_keys(q1 - q0, k1 - k0, c.causal, window=window)
        expected[q0:q1, k0:k1] = True if block is None else block
    assert torch.equal(mask_mod(0, 0, rows, cols), expected)


# -- the same draws, every reference against the oracle -------------------------------------------
# The head dims both declare: flex's Triton template on CUDA takes none below 16.
FLEX_DIMS = dict(head_dims=flex.CAPS.head_dims)

@DRAWS
@given(attention_cases(dataclasses.replace(sdpa_alibi.CAPS, zero_length=False, **FLEX_DIMS),
                       dtype="float32", profile=CI).filter(lambda c: bool(c.alibi)))
def test_sdpa_and_flex_agree_with_the_oracle_under_alibi(eager_flex, c):
    for impl in (sdpa_alibi.IMPL, flex.IMPL):
        report = judge(impl, c)
        assert report.passed, report.describe()


@DRAWS
@given(attention_cases(dataclasses.replace(sdpa_varlen.CAPS, zero_length=False, **FLEX_DIMS),
                       dtype="float32", profile=CI))
def test_sdpa_and_flex_agree_with_the_oracle_on_packed_batches(eager_flex, c):
    for impl in (sdpa_varlen.IMPL, flex_varlen.IMPL):
        report = judge(impl, c)
        assert report.passed, report.describe()


@pytest.mark.parametrize("seqlens_q,seqlens_k", [((3, 0, 1), (2, 4, 0)), ((0,), (3,)),
                                                 ((2, 1), (0, 0)), ((1, 1, 1), (1, 1, 1))])
def test_sdpa_varlen_takes_sequences_of_length_zero_and_one(seqlens_q, seqlens_k):
    for causal, window in (("none", (-1, -1)), ("bottom_right", (0, -1))):
        c = AttentionCase(batch=1, heads=2, kv_heads=1, head_dim=8, causal=causal, window=window,
                          **relengthed(seqlens_q, seqlens_k))
        report = judge(sdpa_varlen.IMPL, c)
        assert report.passed, report.describe()


# -- broken copies are caught ---------------------------------------------------------------------
def _flipped_alibi(q, k, v, *, alibi_slopes=None, **kw):
    """sdpa_alibi with the bias's sign flipped: near keys weigh less than far ones."""
    flipped = None if alibi_slopes is None else -alibi_slopes
    return sdpa_alibi.sdpa_alibi_forward(q, k, v, alibi_slopes=flipped, **kw)


def _leaky_varlen(q, k, v, *, cu_seqlens_k, max_seqlen_k, **kw):
    """sdpa_varlen reading one key past each sequence's last (where there is one)."""
    ends = torch.minimum(cu_seqlens_k[1:] + 1, cu_seqlens_k[-1:])
    widened = torch.cat([cu_seqlens_k[:1], ends]).int()
    return sdpa_varlen.sdpa_varlen_forward(q, k, v, cu_seqlens_k=widened,
                                           max_seqlen_k=max_seqlen_k + 1, **kw)


@pytest.mark.parametrize("broken", [
    Implementation("sdpa_alibi_flipped", _flipped_alibi, sdpa_alibi.CAPS),
    Implementation("sdpa_varlen_leaky", _leaky_varlen, sdpa_varlen.CAPS)], ids=lambda i: i.name)
def test_a_small_campaign_catches_a_broken_sdpa_reference(broken):
    result = fuzz(broken, attention_cases(broken.caps, dtype="float32", profile=CI),
                  max_examples=80, save_to_file=False)
    assert result.counterexample is not None, f"{broken.name} survived {result.cases} cases"
    found = result.counterexample.judged.case
    assert found.alibi if broken.caps.alibi else found.varlen, found


def test_flex_with_the_alibi_sign_flipped_is_caught(eager_flex, monkeypatch):
    c = AttentionCase(batch=1, heads=2, kv_heads=1, seq_q=5, seq_k=9, head_dim=16,
                      causal="bottom_right", alibi="steep")
    assert judge(flex.IMPL, c).passed
    right = flex._alibi.__wrapped__

    def flipped(slopes, shift, softcap, device):
        return right(tuple(-s for s in slopes), shift, softcap, device)
    monkeypatch.setattr(flex, "_alibi", flipped)
    report = judge(flex.IMPL, c)
    assert not report.passed and report.failures[0].check == "out", report.describe()


def test_flex_varlen_without_the_document_test_is_caught(eager_flex, monkeypatch):
    c = AttentionCase(batch=1, heads=2, kv_heads=1, head_dim=16, **relengthed((2, 3), (4, 2)))
    assert judge(flex_varlen.IMPL, c).passed
    monkeypatch.setattr(flex_varlen, "document_mask",
                        lambda *args: lambda b, h, q_idx, kv_idx: q_idx >= 0)
    assert not judge(flex_varlen.IMPL, c).passed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("slopes", [None, torch.tensor([0.5, 0.0625])])
def test_sdpa_alibi_never_hands_sdpa_a_mask_of_another_dtype(monkeypatch, dtype, slopes):
    """CUDA's memory-efficient SDPA refuses an additive mask whose dtype is not the query's
    ("invalid dtype for bias"): a float32 bias with half inputs is a call on float32 copies,
    whose out comes back in the input dtype."""
    seen = []
    real = sdpa_window.F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, **kw):
        seen.append((q.dtype, None if attn_mask is None else attn_mask.dtype))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(sdpa_window.F, "scaled_dot_product_attention", recording)
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=dtype) for _ in range(3))
    out, lse = sdpa_alibi.sdpa_alibi_forward(q, k, v, causal="bottom_right", scale=0.5,
                                             alibi_slopes=slopes)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert seen and all(mask is None or mask in (torch.bool, query) for query, mask in seen)
    assert (seen[0][0] == torch.float32) == (slopes is not None or dtype == torch.float32)
