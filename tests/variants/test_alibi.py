"""ALiBi: the slope families, the case's field, the oracle's bias and its order after the
softcap, the draws, the tiled kernel that declares it, and the mutants that get it wrong."""
from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from hypothesis import find, settings
from hypothesis.errors import NoSuchExample

from fuzzattn import AttentionCase
from fuzzattn.campaigns.cause_shrink import candidates
from fuzzattn.campaigns.defects import match_class, one_change_variants
from fuzzattn.cli.explain import variants as explain_variants
from fuzzattn.contract import Capabilities, Implementation, profiles
from fuzzattn.contract.alibi import FAMILIES, alibi_slopes, max_bias
from fuzzattn.contract.capabilities import UnsupportedCaseError
from fuzzattn.contract.case import CaseError
from fuzzattn.inputs.materialize import materialize
from fuzzattn.judgement.judge import judge
from fuzzattn.judging.oracle import oracle
from fuzzattn.kernels.torch_tiled import IMPL as TILED, torch_tiled_forward
from fuzzattn.relations.forward import RELATIONS
from fuzzattn.relations.rounding import Rounding
from fuzzattn.strategies.cases import UNBIASED_VALUES, attention_cases
from variant_kit import (REGRESSIONS, RecordingKernel, assert_catches_only_the_mutant,
                         assert_gradient_oracle_is_autograd, case, killing_case, shipped, tensors)

ALIBI_MUTANTS = ("mutant_alibi_wrong_sign", "mutant_alibi_top_left")


# -- slopes ---------------------------------------------------------------------------------------
def test_slope_families_are_float32_per_head_and_named_on_error():
    assert alibi_slopes("standard", 8).tolist() == [2.0 ** -h for h in range(1, 9)]
    steep = alibi_slopes("steep", 8)
    assert steep[0].item() == 1.0 and steep[-1].item() == 8.0
    assert alibi_slopes("steep", 1).tolist() == [1.0]
    assert torch.equal(alibi_slopes("tiny", 4), alibi_slopes("standard", 4) / 1024)
    for family in FAMILIES:
        slopes = alibi_slopes(family, 5)
        assert slopes.dtype == torch.float32 and len(set(slopes.tolist())) == 5, family
    with pytest.raises(ValueError, match="alibi='geometric'"):
        alibi_slopes("geometric", 4)
    # The farthest pair is max(Nq, Nk) - 1 apart: Nq = 2, Nk = 6 -> query 1 and key 0, 5 apart.
    assert max_bias("steep", 2, 2, 6) == 8.0 * 5 and max_bias("", 2, 2, 6) == 0.0


# -- the oracle on hand-computed cases ---------------------------------------------------------
def test_the_bias_is_measured_from_the_bottom_right_diagonal():
    # One head, steep: slope 1. Nq = 2, Nk = 4: row i's diagonal key is i + 2.
    c = case(2, 4, alibi="steep")
    q, k, v = tensors(c)
    ref = oracle(q, k, v, c)
    for i in range(2):
        scores = [c.softmax_scale * float(q[0, 0, i] @ k[0, 0, j]) - abs(i + 2 - j)
                  for j in range(4)]
        lse = math.log(sum(map(math.exp, scores)))
        assert ref.lse[0, 0, i].item() == pytest.approx(lse, abs=1e-12)
        weights = torch.tensor([math.exp(s - lse) for s in scores], dtype=torch.float64)
        assert torch.allclose(ref.out[0, 0, i], weights @ v[0, 0], rtol=0, atol=1e-12)


def test_the_bias_comes_after_the_softcap_and_before_the_mask():
    c = case(1, 3, values="large", softcap=2.0, alibi="steep", causal="top_left")
    q, k, v = tensors(c)
    # Top-left, one query: key 0 alone is visible; its bias is -|0 + 2 - 0| = -2 after the cap.
    score = 2.0 * math.tanh(c.softmax_scale * float(q[0, 0, 0] @ k[0, 0, 0]) / 2.0) - 2.0
    ref = oracle(q, k, v, c)
    assert ref.lse[0, 0, 0].item() == pytest.approx(score, abs=1e-12)
    assert -4.0 <= ref.lse[0, 0, 0].item() <= 0.0      # capped first, then biased


def test_the_score_magnitude_counts_the_bias():
    c = case(1, 9, alibi="steep")
    q, k, v = tensors(c)
    # Each score sums its D products and its bias: slope 1, key j is 8 - j from the diagonal.
    terms = [c.softmax_scale * float(q[0, 0, 0].abs() @ k[0, 0, j].abs()) + 8 - j
             for j in range(9)]
    assert oracle(q, k, v, c).score_magnitude == pytest.approx(max(terms), rel=1e-12)
    assert Rounding(TILED, c).bias_error == pytest.approx(2 * 2.0 ** -24 * 8.0)


def test_gradient_oracle_matches_autograd_with_alibi_softcap_and_window():
    c = AttentionCase(batch=1, heads=2, kv_heads=1, seq_q=3, seq_k=5, head_dim=4,
                      causal="bottom_right", window=(2, 0), softcap=1.5, alibi="scaled",
                      data_seed=3)
    i, j = torch.arange(3)[:, None], torch.arange(5)[None, :]
    slopes = torch.tensor([4 * 2.0 ** -4, 4 * 2.0 ** -8], dtype=torch.float64)
    assert_gradient_oracle_is_autograd(c, (j <= i + 2) & (j >= i + 2 - 2), dout_seed=2,
                                       bias=-slopes[:, None, None] * (i + 2 - j).abs())


def test_relations_hold_under_alibi_except_key_permutation():
    c = AttentionCase(batch=2, heads=2, kv_heads=1, seq_q=5, seq_k=9, head_dim=8,
                      causal="bottom_right", alibi="steep")
    assert RELATIONS["key_permutation"](TILED, c, "cpu") is None
    for relation in ("value_shift", "batch_independence", "score_shift", "causal_prefix"):
        verdict = RELATIONS[relation](TILED, c, "cpu")
        assert verdict is not None and verdict.passed, verdict


# -- the case's field ----------------------------------------------------------------------------
def test_alibi_round_trips_and_is_omitted_when_off():
    c = case(3, 5, alibi="tiny")
    d = c.to_dict()
    assert d["alibi"] == "tiny" and "alibi" not in case(3, 5).to_dict()
    assert AttentionCase.from_dict(json.loads(json.dumps(d))) == c
    assert "alibi=tiny" in str(c) and "alibi" not in str(case(3, 5))
    assert c.variants == ("alibi",) and c.key() != case(3, 5).key()
    for path in REGRESSIONS.glob("*.json"):
        saved = json.loads(path.read_text())["case"]
        loaded = AttentionCase.from_dict(saved)
        assert ("alibi" in saved) == bool(loaded.alibi) == ("alibi" in loaded.to_dict()), path


@pytest.mark.parametrize("value", ["geometric", "Standard", 1.0, None, True, ["steep"]],
                         ids=repr)
def test_bad_alibi_is_a_one_line_error_naming_the_value(value):
    with pytest.raises(CaseError) as excinfo:
        case(2, 2, alibi=value)
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith(f"alibi={value!r}")


def test_only_declaring_implementations_get_slopes():
    plain = Capabilities(head_dims=None)
    assert plain.why_not(case(2, 2, alibi="steep")) == "alibi=steep"
    assert TILED.caps.why_not(case(2, 2, alibi="steep", softcap=1.0, window=(1, 1))) is None
    recording = RecordingKernel()
    Implementation(name="plain", fn=recording, caps=plain)(*materialize(case(2, 2)).tensors(),
                                                           case(2, 2))
    (call,) = recording.calls
    assert set(call.kwargs) == {"causal", "scale"}          # a plain signature: no alibi_slopes
    q = k = v = torch.zeros(1, 2, 2, 4)
    for bad in (torch.ones(3), torch.ones(2, dtype=torch.float64), torch.tensor([1.0, math.nan]),
                [1.0, 2.0]):
        with pytest.raises(UnsupportedCaseError, match="alibi_slopes"):
            torch_tiled_forward(q, k, v, causal=False, scale=1.0, alibi_slopes=bad)


def test_the_alibi_fixtures_fail_their_mutants_and_pass_the_kernel():
    for name in ALIBI_MUTANTS:
        files = shipped(name)
        assert files, f"no regression file for {name}"
        for fixture in files:
            assert fixture.case.alibi and fixture.case.key() == fixture.path.stem
            assert_catches_only_the_mutant(fixture, name, TILED)


# -- shrinking and explaining ----------------------------------------------------------------------
def test_alibi_is_a_one_change_predicate_matched_by_class():
    c = case(2, 4, alibi="steep", softcap=2.0)
    found = {name: (value, variants) for name, value, variants in
             one_change_variants(c, TILED.caps)}
    assert found["alibi"] == ("steep", [c.replace(alibi="")])
    assert match_class("alibi", "steep", TILED.caps) == match_class("alibi", "tiny", TILED.caps)
    assert c.replace(alibi="") in candidates(c, TILED.caps)
    changed = {row.changed_to: row.case for row in explain_variants(TILED, c)}
    assert changed["alibi=off"] == c.replace(alibi="")


# -- draws ---------------------------------------------------------------------------------------
def test_alibi_is_drawn_only_when_declared_and_shrinks_to_the_standard_slopes():
    profile = profiles.PROFILES["ci"]
    fast = settings(max_examples=300, database=None, derandomize=True)
    with pytest.raises(NoSuchExample):
        find(attention_cases(Capabilities(head_dims=None), profile=profile),
             lambda c: bool(c.alibi), settings=fast)
    declared = attention_cases(TILED.caps, profile=profile)
    assert find(declared, lambda c: bool(c.alibi), settings=fast).alibi == "standard"
    for family in FAMILIES:
        assert find(declared, lambda c: c.alibi == family, settings=fast).alibi == family
    # Values whose premise is equal weights stay unbiased; a bias would make them inexact.
    with pytest.raises(NoSuchExample):
        find(declared, lambda c: bool(c.alibi) and c.values in UNBIASED_VALUES, settings=fast)


def test_exact_mean_is_exact_only_without_a_bias():
    # q = 0: every visible key weighs 1 and the output is v's constant exactly; biased, it is not.
    c = AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=3, seq_k=7, head_dim=4,
                      dtype="bfloat16", values="exact_mean")
    q, k, v = materialize(c).tensors()
    assert not q.any() and oracle(q, k, v, c).out.eq(v[:, :, :1].double()).all()
    biased = oracle(q, k, v, c.replace(alibi="steep"))
    assert biased.lse[0, 0, 0].item() < math.log(7)       # the keys no longer weigh 1 each


# -- the correct kernel, and the mutants ---------------------------------------------------------
def test_tiled_kernel_matches_the_oracle_with_every_family():
    for family, (seq_q, seq_k), causal in itertools.product(
            FAMILIES, ((1, 5), (5, 17), (17, 3), (16, 16), (4, 0)),
            ("none", "top_left", "bottom_right")):
        c = AttentionCase(batch=1, heads=3, kv_heads=1, seq_q=seq_q, seq_k=seq_k, head_dim=8,
                          causal=causal, alibi=family, window=(4, -1) if seq_q == 5 else (-1, -1))
        report = judge(TILED, c)
        assert report.passed, report.describe()


@pytest.mark.parametrize("name", ALIBI_MUTANTS)
def test_a_small_campaign_kills_each_alibi_mutant(name):
    found = killing_case(name)
    assert found.alibi, found
