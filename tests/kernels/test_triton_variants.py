"""Real kernels that declare the window and softcap variants: the Triton FA2 forward and backward
(tile skipping at the window's edges, a softcap folded into exp2), SDPA with the window as an
explicit mask, and flex's band mask_mod; and the compiled-kernel mutant of the window's skip bound."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import triton
import triton.language as tl

from fuzzattn import AttentionCase
from fuzzattn.campaigns.campaign import fuzz
from fuzzattn.contract import profiles
from fuzzattn.contract.capabilities import UnsupportedCaseError
from fuzzattn.judgement.judge import judge
from fuzzattn.judging.oracle import visible_keys
from fuzzattn.kernels import flex, sdpa, sdpa_window, triton_fa2, triton_fa2_variants
from fuzzattn.run.registry import implementations, mutants
from fuzzattn.strategies.cases import attention_cases

TRITON = triton_fa2.IMPL
SDPA_WINDOW = sdpa_window.IMPL


def case(seq_q, seq_k, *, block_m=16, block_n=16, **kw) -> AttentionCase:
    config = (("BLOCK_M", block_m), ("BLOCK_N", block_n), ("num_stages", 1), ("num_warps", 4))
    return AttentionCase(batch=1, heads=2, kv_heads=1, seq_q=seq_q, seq_k=seq_k, head_dim=16,
                         config=config, **kw)


def test_the_triton_kernels_declare_both_variants_forward_and_backward():
    assert TRITON.caps.window and TRITON.caps.softcap and TRITON.caps.backward
    assert TRITON.supports(case(3, 5, window=(1, 0), softcap=2.0))
    q = k = v = torch.zeros(1, 1, 2, 16)
    with pytest.raises(UnsupportedCaseError, match="window"):
        triton_fa2.triton_fa2_forward(q, k, v, causal=False, scale=1.0, window=(0, -2))
    with pytest.raises(UnsupportedCaseError, match="softcap"):
        triton_fa2.triton_fa2_forward(q, k, v, causal=False, scale=1.0, softcap=math.nan)


@pytest.mark.parametrize("causal,window,expected", [
    ("none", (-1, -1), (None, None)),
    ("top_left", (-1, -1), (0, None)),
    ("bottom_right", (-1, -1), (3, None)),
    ("none", (2, 1), (4, 1)),             # s = 3: 3 - 2 <= j - i <= 3 + 1
    ("top_left", (2, 1), (0, 1)),         # causal's diagonal is nearer than the right edge
    ("bottom_right", (0, 5), (3, 3)),
])
def test_causal_and_window_meet_in_two_edges(causal, window, expected):
    upper, lower = triton_fa2_variants.mask_edges(causal, window, 2, 5)
    assert (upper, lower) == expected
    kept = visible_keys(2, 5, causal, window=window)
    rows, cols = torch.arange(2)[:, None], torch.arange(5)[None, :]
    band = torch.ones(2, 5, dtype=torch.bool)
    if upper is not None:
        band &= cols - rows <= upper
    if lower is not None:
        band &= cols - rows >= lower
    assert torch.equal(band, torch.ones(2, 5, dtype=torch.bool) if kept is None else kept)


@triton.jit
def _tanh_kernel(X, Y, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < N)
    tl.store(Y + offs, triton_fa2_variants.tanh(x), mask=offs < N)


def _kernel_tanh(inputs: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(inputs)
    _tanh_kernel[(1,)](inputs, out, inputs.numel(), BLOCK=triton.next_power_of_2(inputs.numel()))
    return out


def test_the_kernels_tanh_is_within_a_few_ulps_and_keeps_nan():
    x = torch.cat([torch.linspace(-30, 30, 1000), torch.logspace(-30, 1.5, 500),
                   -torch.logspace(-30, 1.5, 500), torch.tensor([0.625, -0.625, 0.0])])
    got = _kernel_tanh(x)
    exact = torch.tanh(x.double())
    ulps = (got.double() - exact).abs() / (torch.finfo(torch.float32).eps * exact.abs())
    ulps = torch.where(exact == 0, (got != 0).double(), ulps)
    assert ulps.max() <= 4, (x[ulps.argmax()], ulps.max())
    assert torch.equal(_kernel_tanh(-x), -got)                 # odd, as the cap must be
    special = _kernel_tanh(torch.tensor([math.inf, -math.inf, math.nan]))
    assert special[:2].tolist() == [1.0, -1.0] and math.isnan(special[2])


# Lengths around one and two 16-key blocks, windows that start mid-block, on a block edge, and
# past every key; tiles 16x16 and the unequal ones, where a skip bound rounded the wrong way shows.
EDGE_CASES = [
    (seq_q, seq_k, causal, window, softcap, block_m, block_n)
    for (seq_q, seq_k), causal, window, softcap, (block_m, block_n) in itertools.product(
        ((1, 20), (17, 33), (33, 17)), ("none", "top_left", "bottom_right"),
        ((0, 0), (5, -1), (16, 1), (-1, 2), (40, 0)), (0.0, 2.0), ((16, 16), (32, 16), (16, 32)))
    # every window in each tile shape; the causal alignments and the softcap (which moves no
    # bound) on 16x16 only
    if (block_m, block_n) == (16, 16) or (causal == "none" and not softcap)]


@pytest.mark.parametrize("seq_q,seq_k,causal,window,softcap,block_m,block_n", EDGE_CASES)
def test_triton_forward_matches_the_oracle_at_the_window_edges(seq_q, seq_k, causal, window,
                                                               softcap, block_m, block_n):
    c = case(seq_q, seq_k, causal=causal, window=window, softcap=softcap, block_m=block_m,
             block_n=block_n)
    report = judge(TRITON, c, gradients=False)
    assert report.passed, report.describe()


@pytest.mark.parametrize("causal,window,softcap", [
    ("none", (5, -1), 2.0), ("top_left", (3, 1), 0.0), ("bottom_right", (0, 4), 5.0),
    ("none", (40, 0), 1.0)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_triton_gradients_hold_through_the_window_and_softcap(causal, window, softcap, dtype):
    # 33 queries over 17 keys and the reverse: rows and key blocks that see nothing on both sides.
    for seq_q, seq_k in ((33, 17), (17, 33)):
        c = case(seq_q, seq_k, causal=causal, window=window, softcap=softcap, dtype=dtype)
        report = judge(TRITON, c)
        assert report.passed, report.describe()
        assert any(v.check.startswith("grad") for v in report.verdicts), report.verdicts


def test_a_short_triton_campaign_with_variants_passes():
    profile = profiles.PROFILES["ci"]
    result = fuzz(TRITON, attention_cases(TRITON.caps, dtype="float32", profile=profile),
                  max_examples=30, save_to_file=False)
    assert result.counterexample is None and result.cases >= 30


def test_a_small_campaign_kills_the_window_skip_mutant():
    mutant = mutants()["mutant_window_skip_rounds_up"]
    assert mutant.mutant_of == "triton_fa2"
    result = fuzz(mutant, attention_cases(mutant.caps, dtype="float32",
                                          profile=profiles.PROFILES["ci"]),
                  max_examples=80, save_to_file=False, shrink=False)
    assert result.counterexample is not None, f"survived {result.cases} cases"
    assert result.counterexample.judged.case.windowed


# -- references ------------------------------------------------------------------------------------
def test_sdpa_window_is_registered_declaring_the_window_alone():
    assert implementations()["sdpa_window"] is SDPA_WINDOW
    assert SDPA_WINDOW.caps.window and not SDPA_WINDOW.caps.softcap
    assert SDPA_WINDOW.caps.why_not(case(2, 3, softcap=2.0)) == "softcap=2"
    # The sdpa registrations keep their declaration: no variant reaches them.
    for name in ("sdpa", *(impl.name for impl in sdpa.BACKEND_IMPLS)):
        assert not implementations()[name].caps.window, name


@pytest.mark.parametrize("seq_q,seq_k,causal,window", [
    (4, 6, "none", (1, 0)), (6, 4, "bottom_right", (1, 1)), (5, 5, "top_left", (-1, 2)),
    (3, 8, "none", (0, -1)), (4, 0, "none", (1, 1)), (3, 5, "none", (-1, -1))])
def test_sdpa_window_matches_the_oracle_with_gradients(seq_q, seq_k, causal, window):
    # (4, 6) with (1, 0): every row's band holds two keys; (3, 8) with (0, -1) leaves keys 0..4
    # unseen; Nk = 0: every row empty. Gradients are judged too: empty rows stay finite.
    c = AttentionCase(batch=1, heads=2, kv_heads=1, seq_q=seq_q, seq_k=seq_k, head_dim=8,
                      causal=causal, window=window)
    report = judge(SDPA_WINDOW, c)
    assert report.passed, report.describe()


@pytest.mark.parametrize("causal,window", [("none", (2, 1)), ("top_left", (3, -1)),
                                           ("bottom_right", (-1, 0)), ("none", (0, 0)),
                                           ("top_left", (-1, 4)), ("none", (-1, -1))])
@pytest.mark.parametrize("seq_q,seq_k", [(3, 7), (7, 3)])
def test_flex_block_mask_keeps_exactly_the_defined_band(causal, window, seq_q, seq_k):
    if flex.UNAVAILABLE:
        pytest.skip(flex.UNAVAILABLE)
    block_mask = flex._block_mask(seq_q, seq_k, causal, window, "cpu")
    expected = visible_keys(seq_q, seq_k, causal, window=window)
    if expected is None:
        assert block_mask is None
        return
    rows, cols = torch.meshgrid(torch.arange(seq_q), torch.arange(seq_k), indexing="ij")
    kept = block_mask.mask_mod(torch.tensor(0), torch.tensor(0), rows, cols)
    assert torch.equal(kept, expected)


def test_flex_softcap_score_mod_is_the_definition():
    score = torch.linspace(-20, 20, 41)
    capped = flex._softcap(3.0, "cpu")(score, None, None, None, None)
    assert torch.allclose(capped, 3.0 * torch.tanh(score / 3.0), rtol=0, atol=1e-6)
