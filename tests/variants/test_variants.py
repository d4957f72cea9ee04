"""Sliding windows and softcaps: the case's fields, the oracle's definitions, the draws, the
tiled kernel that declares them, and the mutants that get them wrong."""
from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from hypothesis import find, settings
from hypothesis.errors import NoSuchExample

from fuzzattn import AttentionCase
from fuzzattn.campaigns.campaign import Counterexample, check_case, fuzz
from fuzzattn.campaigns.cause_shrink import candidates
from fuzzattn.campaigns.regression_file import load
from fuzzattn.campaigns.file_replay import replay_one
from fuzzattn.campaigns.defects import match_class, one_change_variants
from fuzzattn.cli.explain import variants as explain_variants
from fuzzattn.contract import Capabilities, profiles
from fuzzattn.contract.capabilities import UnsupportedCaseError
from fuzzattn.contract.case import CaseError
from fuzzattn.judgement.judge import judge
from fuzzattn.judging.oracle import oracle, some_row_empty, visibility, visible_keys
from fuzzattn.kernels.torch_tiled import IMPL as TILED, torch_tiled_forward
from fuzzattn.relations.forward import RELATIONS
from fuzzattn.run.registry import mutants
from fuzzattn.strategies.cases import UNCAPPED_VALUES, attention_cases
from variant_kit import (REGRESSIONS, assert_gradient_oracle_is_autograd, case, killing_case,
                         tensors)

VARIANT_MUTANTS = ("mutant_window_edge_off_by_one", "mutant_window_top_left",
                   "mutant_softcap_after_mask", "mutant_softcap_unscaled")


# -- the oracle on hand-computed cases ---------------------------------------------------------
def test_a_zero_window_sees_only_the_bottom_right_diagonal():
    c = case(2, 4, window=(0, 0))
    q, k, v = tensors(c)
    ref = oracle(q, k, v, c)
    for i in range(2):                       # row i sees key i + Nk - Nq alone: weight 1
        assert torch.allclose(ref.out[0, 0, i], v[0, 0, i + 2], rtol=0, atol=1e-12)
        score = c.softmax_scale * float(q[0, 0, i] @ k[0, 0, i + 2])
        assert ref.lse[0, 0, i].item() == pytest.approx(score, abs=1e-12)


def test_a_window_past_every_key_gives_empty_rows():
    # Nq = 3, Nk = 1, window (0, 0): row i sees key i - 2, so rows 0 and 1 see nothing.
    c = case(3, 1, window=(0, 0))
    ref = oracle(*tensors(c), c)
    assert ref.empty_rows.tolist() == [True, True, False] and ref.some_empty
    assert ref.out[0, 0, :2].abs().max().item() == 0.0
    assert ref.lse[0, 0, :2].tolist() == [-math.inf, -math.inf]
    assert math.isfinite(ref.lse[0, 0, 2].item())


def test_window_and_causal_masks_intersect():
    # Nq = 3, Nk = 5: top-left causal keeps j <= i, the window (1, -1) (bottom-right, shift 2)
    # keeps j >= i + 1: nothing. Bottom-right causal keeps j <= i + 2: keys i + 1 and i + 2.
    assert visible_keys(3, 5, "top_left", window=(1, -1)).int().tolist() == [
        [0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]
    assert visible_keys(3, 5, "bottom_right", window=(1, -1)).int().tolist() == [
        [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    assert visible_keys(2, 4, "none", window=(-1, 0)).int().tolist() == [
        [1, 1, 1, 0], [1, 1, 1, 1]]


def test_empty_rows_are_known_from_the_lengths_for_every_window():
    for seq_q, seq_k, causal, left, right in itertools.product(
            range(0, 5), range(0, 5), ("none", "top_left", "bottom_right"), range(-1, 4),
            range(-1, 4)):
        c = case(seq_q, seq_k, causal=causal, window=(left, right))
        seen = visibility(c, "cpu")
        assert some_row_empty(seq_q, seq_k, causal, (left, right)) == bool(seen.empty.any()), c


def test_softcap_bounds_the_scores_before_the_softmax():
    c = case(1, 2, values="large", softcap=2.0)
    q, k, v = tensors(c)
    scores = [c.softmax_scale * float(q[0, 0, 0] @ k[0, 0, j]) for j in range(2)]
    assert max(abs(s) for s in scores) > 100      # far beyond the cap
    capped = [2.0 * math.tanh(s / 2.0) for s in scores]
    ref = oracle(q, k, v, c)
    assert ref.lse[0, 0, 0].item() == pytest.approx(math.log(sum(map(math.exp, capped))), abs=1e-12)
    assert abs(ref.lse[0, 0, 0].item()) <= 2.0 + math.log(2)


def test_gradient_oracle_differentiates_through_the_softcap_and_window():
    c = AttentionCase(batch=1, heads=2, kv_heads=1, seq_q=3, seq_k=5, head_dim=4,
                      causal="bottom_right", window=(1, 0), softcap=1.5, data_seed=7)
    # Textbook autograd: the mask from the definition, the cap before it.
    i, j = torch.arange(3)[:, None], torch.arange(5)[None, :]
    assert_gradient_oracle_is_autograd(c, (j <= i + 2) & (j >= i + 2 - 1) & (j <= i + 2 + 0))


def test_tiled_gradients_are_judged_under_a_softcap():
    report = judge(TILED, case(4, 6, causal="top_left", window=(3, 1), softcap=2.0))
    assert report.passed, report.describe()
    assert {"grad_dq", "grad_dk", "grad_dv"} <= {v.check for v in report.verdicts}


def test_relations_a_variant_breaks_do_not_apply():
    windowed = AttentionCase(batch=2, heads=1, kv_heads=1, seq_q=4, seq_k=6, head_dim=4,
                             window=(1, 1))
    capped = windowed.replace(window=(-1, -1), softcap=2.0)
    assert RELATIONS["key_permutation"](TILED, windowed, "cpu") is None
    assert RELATIONS["score_shift"](TILED, capped, "cpu") is None
    for relation in ("value_shift", "batch_independence"):
        for c in (windowed, capped):
            verdict = RELATIONS[relation](TILED, c, "cpu")
            assert verdict is not None and verdict.passed, verdict


# -- the case's fields ---------------------------------------------------------------------------
def test_saved_regressions_keep_their_keys_and_files():
    matched = 0
    for path in sorted(REGRESSIONS.glob("*.json")):
        saved = json.loads(path.read_text())["case"]
        loaded = AttentionCase.from_dict(saved)
        # A file without the fields is a plain case, and writes none back: its key is unchanged.
        assert ("window" in saved, "softcap" in saved) == (loaded.windowed, bool(loaded.softcap))
        assert ("window" in loaded.to_dict(), "softcap" in loaded.to_dict()) == \
            ("window" in saved, "softcap" in saved), path.name
        matched += loaded.key() == path.stem
    # The 44 files named by their case's key before the variants, and the four variant mutants'.
    assert matched >= 48


def test_variants_round_trip_and_print_only_when_set():
    c = case(3, 5, window=(2, -1), softcap=5.0)
    d = c.to_dict()
    assert d["window"] == [2, -1] and d["softcap"] == 5.0
    assert AttentionCase.from_dict(json.loads(json.dumps(d))) == c
    assert "window=2,-1 softcap=5" in str(c)
    assert "window" not in str(case(3, 5)) and "softcap" not in str(case(3, 5))
    assert case(3, 5, window=(2, -1)).key() != case(3, 5).key()


@pytest.mark.parametrize("kw", [dict(window=(-2, 0)), dict(window=(0,)), dict(window=(1.5, 0)),
                                dict(window=(True, 0)), dict(window="1,1"), dict(softcap=-1.0),
                                dict(softcap=math.inf), dict(softcap=math.nan),
                                dict(softcap=1e9), dict(softcap=True)],
                         ids=lambda kw: repr(kw))
def test_bad_variants_are_one_line_errors_naming_the_value(kw):
    with pytest.raises(CaseError) as excinfo:
        case(2, 2, **kw)
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith(next(iter(kw)) + "=")


def test_capabilities_refuse_undeclared_variants():
    plain = Capabilities(head_dims=None)
    assert plain.why_not(case(2, 2, window=(1, 1))) == "window=(1, 1)"
    assert plain.why_not(case(2, 2, softcap=3.0)) == "softcap=3"
    assert TILED.caps.why_not(case(2, 2, window=(1, 1), softcap=3.0)) is None
    q = k = v = torch.zeros(1, 1, 2, 4)
    with pytest.raises(UnsupportedCaseError, match="window"):
        torch_tiled_forward(q, k, v, causal=False, scale=1.0, window=(-3, 0))
    with pytest.raises(UnsupportedCaseError, match="softcap"):
        torch_tiled_forward(q, k, v, causal=False, scale=1.0, softcap=-2.0)


def test_a_variant_failure_is_saved_with_its_fields_and_replays(tmp_path):
    mutant = mutants()["mutant_window_top_left"]
    c = case(1, 3, window=(0, 0))
    with pytest.raises(Counterexample) as excinfo:
        check_case(mutant, c, regressions_dir=tmp_path)
    saved = json.loads(excinfo.value.path.read_text())["case"]
    assert saved["window"] == [0, 0] and "softcap" not in saved
    fixture = load(excinfo.value.path)
    assert fixture.case == c and fixture.case.key() == excinfo.value.path.stem
    assert "window=0,0" in fixture.covers
    assert not replay_one(fixture, mutant).passed and replay_one(fixture, TILED).passed


def test_cause_shrinking_tries_each_variant_off():
    simpler = candidates(case(2, 4, window=(1, 2), softcap=3.0), TILED.caps)
    assert {(s.window, s.softcap) for s in simpler} >= {
        ((-1, -1), 3.0), ((-1, 2), 3.0), ((1, -1), 3.0), ((1, 2), 0.0)}


def test_one_change_predicates_undo_each_variant():
    c = case(2, 4, window=(1, 0), softcap=2.5)
    found = {name: (value, variants) for name, value, variants in
             one_change_variants(c, TILED.caps)}
    assert found["window"] == ("1,0", [c.replace(window=(-1, -1))])
    assert found["softcap"] == ("2.5", [c.replace(softcap=0.0)])
    # A bug needing a softcap (or a window) at one value is one cause met at any other.
    for name, one, other in (("softcap", "2.5", "50"), ("window", "1,0", "-1,3")):
        assert match_class(name, one, TILED.caps) == match_class(name, other, TILED.caps)


def test_explain_judges_each_variant_off():
    c = case(2, 4, window=(1, 0), softcap=2.5)
    changed = {row.changed_to: row.case for row in explain_variants(TILED, c)}
    assert changed["window=-1,-1"] == c.replace(window=(-1, -1))
    assert changed["softcap=0"] == c.replace(softcap=0.0)


# -- draws ---------------------------------------------------------------------------------------
def test_only_declaring_implementations_draw_variants():
    profile = profiles.PROFILES["ci"]
    fast = settings(max_examples=300, database=None, derandomize=True)
    plain = attention_cases(Capabilities(head_dims=None), profile=profile)
    with pytest.raises(NoSuchExample):
        find(plain, lambda c: bool(c.variants), settings=fast)
    declared = attention_cases(TILED.caps, profile=profile)
    both = find(declared, lambda c: c.windowed and c.softcap, settings=fast)
    assert both.window != (-1, -1) and both.softcap > 0
    edge = find(declared, lambda c: c.window[1] == c.seq_k and c.seq_k > 2, settings=fast)
    assert edge.window[1] == edge.seq_k
    # Shrinking moves toward no variant: the minimal windowed case keeps the other side unbounded.
    assert find(declared, lambda c: c.windowed, settings=fast).window in ((0, -1), (-1, 0))
    assert find(declared, lambda c: c.softcap > 0, settings=fast).softcap == 1.0
    # Scores meant to pass a mask sentinel stay uncapped; a softcap would pull them back.
    with pytest.raises(NoSuchExample):
        find(declared, lambda c: c.softcap > 0 and c.values in UNCAPPED_VALUES, settings=fast)


# -- the correct kernel, and the mutants ---------------------------------------------------------
def test_tiled_kernel_matches_the_oracle_on_variant_edges():
    for seq_q, seq_k, causal, window, softcap in itertools.product(
            (1, 5, 17), (0, 3, 18), ("none", "top_left", "bottom_right"),
            ((0, 0), (2, -1), (-1, 1), (17, 0)), (0.0, 1.0)):
        c = AttentionCase(batch=1, heads=2, kv_heads=1, seq_q=seq_q, seq_k=seq_k, head_dim=8,
                          causal=causal, window=window, softcap=softcap)
        report = judge(TILED, c)
        assert report.passed, report.describe()


def test_a_short_campaign_with_variants_passes_the_tiled_kernel():
    profile = profiles.PROFILES["ci"]
    result = fuzz(TILED, attention_cases(TILED.caps, dtype="float32", profile=profile),
                  max_examples=40, save_to_file=False)
    assert result.counterexample is None and result.cases >= 40


@pytest.mark.parametrize("name", VARIANT_MUTANTS)
def test_a_small_campaign_kills_each_variant_mutant(name):
    found = killing_case(name)
    assert found.variants, found
