"""Paged KV caches: the case's field, the layout the contract builds from dense k, v, the
tiled kernel that gathers through the block table, and the mutant that ignores it."""
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
from fuzzattn.contract.capabilities import UnsupportedCaseError
from fuzzattn.contract.case import CaseError
from fuzzattn.contract.paged import page
from fuzzattn.inputs.materialize import materialize
from fuzzattn.judgement.judge import judge
from fuzzattn.kernels.torch_tiled import IMPL as TILED, torch_tiled_forward
from fuzzattn.strategies.cases import attention_cases
from variant_kit import (REGRESSIONS, RecordingKernel, assert_catches_only_the_mutant,
                         killing_case, shipped)

MUTANT = "mutant_paged_logical_blocks"


def case(**kw) -> AttentionCase:
    return AttentionCase(**{**dict(batch=2, heads=2, kv_heads=1, seq_q=3, seq_k=7, head_dim=4),
                            **kw})


# -- the layout ----------------------------------------------------------------------------------
@pytest.mark.parametrize("size,seed", [(1, 0), (2, 5), (3, 1), (4, 2), (16, 9)])
def test_pages_hold_each_sequence_in_order_and_nan_elsewhere(size, seed):
    c = case(paged_kv=size, data_seed=seed)
    inputs = materialize(c)
    paged = page(inputs.k, inputs.v, c)
    per_seq = math.ceil(7 / size)
    assert paged.block_table.dtype == paged.cache_seqlens.dtype == torch.int32
    assert paged.block_table.shape == (2, per_seq) and paged.cache_seqlens.tolist() == [7, 7]
    table = paged.block_table.long()
    # Never the logical order, so a kernel ignoring the table reads other keys.
    assert not torch.equal(table.flatten(), torch.arange(2 * per_seq))
    for cache, dense in ((paged.k_cache, inputs.k), (paged.v_cache, inputs.v)):
        gathered = cache[table].flatten(1, 2)                  # (B, per_seq * size, Hkv, D)
        assert torch.equal(gathered[:, :7].transpose(1, 2), dense)
        assert gathered[:, 7:].isnan().all()                   # the last block's tail
        spare = torch.ones(cache.shape[0], dtype=torch.bool)
        spare[table.flatten()] = False
        assert spare.any() and cache[spare].isnan().all()      # every unmapped block


def test_zero_keys_page_to_an_empty_table():
    c = case(seq_k=0, paged_kv=4)
    paged = page(*materialize(c).tensors()[1:], c)
    assert paged.block_table.shape == (2, 0) and paged.k_cache.isnan().all()


# -- the case's field ----------------------------------------------------------------------------
def test_paged_kv_round_trips_and_is_omitted_when_off():
    c = case(paged_kv=3)
    d = c.to_dict()
    assert d["paged_kv"] == 3 and "paged_kv" not in case().to_dict()
    assert AttentionCase.from_dict(json.loads(json.dumps(d))) == c
    assert "paged_kv=3" in str(c) and "paged" not in str(case())
    assert c.variants == ("paged_kv",) and c.key() != case().key()
    for path in REGRESSIONS.glob("*.json"):
        saved = json.loads(path.read_text())["case"]
        assert ("paged_kv" in saved) == bool(AttentionCase.from_dict(saved).paged_kv), path


@pytest.mark.parametrize("value", [-1, 1.5, True, "16", 1 << 21], ids=repr)
def test_bad_paged_kv_is_a_one_line_error_naming_the_value(value):
    with pytest.raises(CaseError) as excinfo:
        case(paged_kv=value)
    assert "\n" not in str(excinfo.value) and str(excinfo.value).startswith(f"paged_kv={value!r}")


def test_only_declaring_implementations_get_pages():
    assert Capabilities(head_dims=None, gqa=True).why_not(case(paged_kv=2)) == "paged_kv=2"
    recording = RecordingKernel()
    plain = Implementation(name="plain", fn=recording, caps=Capabilities(head_dims=None, gqa=True))
    plain(*materialize(case()).tensors(), case())
    (call,) = recording.calls
    assert tuple(call.k.shape) == (2, 1, 7, 4)                  # dense k, v
    assert set(call.kwargs) == {"causal", "scale"}              # a plain signature: no block_table
    c = case(paged_kv=2)
    q, k, v = materialize(c).tensors()
    paged = page(k, v, c)
    good = dict(block_table=paged.block_table, cache_seqlens=paged.cache_seqlens)
    for bad in (dict(good, block_table=paged.block_table.long()),
                dict(good, block_table=paged.block_table + 100),
                dict(good, cache_seqlens=torch.tensor([7, 6], dtype=torch.int32)),
                dict(good, cache_seqlens=torch.tensor([9, 9], dtype=torch.int32))):
        with pytest.raises(UnsupportedCaseError) as excinfo:
            torch_tiled_forward(q, paged.k_cache, paged.v_cache, causal=False, scale=0.5, **bad)
        assert "\n" not in str(excinfo.value)


# -- the kernel, gradients, the mutant -----------------------------------------------------------
def test_tiled_kernel_matches_the_oracle_through_pages():
    for size, (seq_q, seq_k), causal in itertools.product(
            (1, 3, 16), ((1, 5), (5, 17), (17, 3), (4, 0)), ("none", "top_left", "bottom_right")):
        c = case(seq_q=seq_q, seq_k=seq_k, head_dim=8, causal=causal, paged_kv=size,
                 alibi="steep" if size == 3 else "")
        report = judge(TILED, c)
        assert report.passed, report.describe()
    # Gradients by autograd reach k and v through the pages, and are judged.
    report = judge(TILED, case(causal="bottom_right", paged_kv=2))
    assert report.passed and {"grad_dk", "grad_dv"} <= {v.check for v in report.verdicts}


def test_the_paged_fixture_fails_the_mutant_and_passes_the_kernel():
    (fixture,) = shipped(MUTANT)
    assert fixture.case.paged_kv
    assert_catches_only_the_mutant(fixture, MUTANT, TILED)


def test_a_small_campaign_kills_the_mutant():
    assert killing_case(MUTANT).paged_kv


# -- draws, shrinking, explaining ------------------------------------------------------------------
def test_pages_are_drawn_only_when_declared_and_shrink_toward_one_row_blocks():
    profile = profiles.PROFILES["ci"]
    fast = settings(max_examples=300, database=None, derandomize=True)
    with pytest.raises(NoSuchExample):
        find(attention_cases(Capabilities(head_dims=None), profile=profile),
             lambda c: bool(c.paged_kv), settings=fast)
    declared = attention_cases(TILED.caps, profile=profile)
    assert find(declared, lambda c: bool(c.paged_kv), settings=fast).paged_kv == 1
    assert find(declared, lambda c: c.paged_kv == 16 and c.seq_k > 16, settings=fast).paged_kv == 16


def test_paged_kv_is_a_one_change_predicate_matched_by_class():
    c = case(paged_kv=4, alibi="tiny")
    found = {name: (value, variants) for name, value, variants in
             one_change_variants(c, TILED.caps)}
    assert found["paged_kv"] == ("4", [c.replace(paged_kv=0)])
    assert found["alibi"] == ("tiny", [c.replace(alibi="")])
    assert match_class("paged_kv", "4", TILED.caps) == match_class("paged_kv", "1", TILED.caps)
    assert c.replace(paged_kv=0) in candidates(c, TILED.caps)
    changed = {row.changed_to: row.case for row in explain_variants(TILED, c)}
    assert changed["paged_kv=0"] == c.replace(paged_kv=0)


@pytest.mark.parametrize("size, seq_q, seq_k, whole, odd", [
    (2, 1, 1, (2, 2), None),            # Nk + 1 is the whole page: one predicate, the page's
    (3, 1, 2, (1, 3), None),
    (4, 3, 3, (4, 4), None),            # Nq == Nk kept: both grow
    (4, 5, 2, (5, 4), None),
    (4, 4, 2, (6, 4), None),            # Nq > Nk kept: both grow
    (4, 3, 5, (3, 8), (3, 6)),          # a cure apart from the page's: both named
    (4, 3, 8, None, None),
    (0, 3, 5, None, (3, 6)),
])
def test_a_partial_last_page_is_one_predicate_whatever_the_page_size(size, seq_q, seq_k, whole, odd):
    c = case(paged_kv=size, seq_q=seq_q, seq_k=seq_k)
    found = {name: variants for name, _, variants in one_change_variants(c, TILED.caps)}
    for name, lengths in (("last page partial", whole), ("Nk odd", odd)):
        expected = None if lengths is None else [c.replace(seq_q=lengths[0], seq_k=lengths[1])]
        assert found.get(name) == expected, (name, found)
