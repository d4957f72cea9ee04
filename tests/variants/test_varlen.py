"""Packed ragged batches: the case's lengths, the packed call, the per-sequence oracle, the draws,
the reference loop that declares them, and the mutants and checks that see a leak or a dropped
sequence."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hypothesis import find, given, settings

from fuzzattn import AttentionCase
from fuzzattn.campaigns.cause_shrink import candidates
from fuzzattn.campaigns.defects import cured, factors, one_change_variants
from fuzzattn.campaigns.sequences import EMPTY_SEQUENCE, MANY_SEQUENCES
from fuzzattn.cli.explain import variants as explain_variants
from fuzzattn.contract import Implementation, profiles
from fuzzattn.contract.capabilities import UnsupportedCaseError, refuse
from fuzzattn.contract.case import CaseError
from fuzzattn.contract.implementation import ContractError
from fuzzattn.contract.varlen import check_packed, relengthed, spans
from fuzzattn.inputs.materialize import materialize
from fuzzattn.judgement.judge import judge
from fuzzattn.judging.oracle import oracle
from fuzzattn.kernels.torch_tiled import IMPL as TILED
from fuzzattn.kernels.torch_varlen import IMPL as VARLEN, torch_varlen_forward
from fuzzattn.relations.forward import RELATIONS
from fuzzattn.run.registry import mutants
from fuzzattn.strategies.cases import attention_cases, undeclared_cases
from fuzzattn.strategies.lengths import seq_shapes
from fuzzattn.strategies.packed import packed_lengths
from variant_kit import (REGRESSIONS, RecordingKernel, assert_catches_only_the_mutant,
                         killing_case, shipped)

VARLEN_MUTANTS = ("mutant_varlen_reads_next_sequence", "mutant_varlen_drops_last_sequence")


def packed(seqlens_q, seqlens_k, **kw) -> AttentionCase:
    fields = dict(batch=1, heads=2, kv_heads=1, head_dim=8)
    fields.update(kw)
    return AttentionCase(**fields, **relengthed(seqlens_q, seqlens_k))


# -- the case ---------------------------------------------------------------------------------
def test_a_dense_case_writes_no_lengths_and_a_packed_one_round_trips():
    dense = AttentionCase(batch=2, heads=1, kv_heads=1, seq_q=3, seq_k=4, head_dim=8)
    assert "seqlens_q" not in dense.to_dict() and not dense.varlen and "varlen" not in dense.variants
    c = packed((3, 0, 1), (2, 5, 0), causal="bottom_right")
    saved = json.loads(json.dumps(c.to_dict()))
    assert saved["seqlens_q"] == [3, 0, 1] and saved["seqlens_k"] == [2, 5, 0]
    assert AttentionCase.from_dict(saved) == c and AttentionCase.from_dict(saved).key() == c.key()
    assert c.variants == ("varlen",) and "seqlens=3/2,0/5,1/0" in str(c)
    assert spans(c) == [(0, 3, 0, 2), (3, 3, 2, 7), (3, 4, 7, 7)]


@pytest.mark.parametrize("fields, message", [
    pytest.param(dict(batch=2, seq_q=2, seq_k=2, seqlens_q=(2,), seqlens_k=(2,)), "batch=2",
                 id="batch=2"),
    pytest.param(dict(batch=1, seq_q=3, seq_k=2, seqlens_q=(2,), seqlens_k=(2,)), "seq_q=3",
                 id="seq_q-not-the-total"),
    pytest.param(dict(batch=1, seq_q=2, seq_k=2, seqlens_q=(1, 1), seqlens_k=(2,)),
                 "same number", id="counts-differ"),
    pytest.param(dict(batch=1, seq_q=2, seq_k=2, seqlens_q=(2,), seqlens_k=()), "seqlens_k=()",
                 id="keys-missing"),
    pytest.param(dict(batch=1, seq_q=1, seq_k=2, seqlens_q=(2, -1), seqlens_k=(1, 1)),
                 "seqlens_q=(2, -1)", id="negative-length"),
])
def test_impossible_lengths_are_refused_naming_the_value(fields, message):
    with pytest.raises(CaseError, match=message.replace("(", r"\(").replace(")", r"\)")):
        AttentionCase(heads=1, kv_heads=1, head_dim=8, **fields)


def test_a_declaration_takes_packed_cases_only_when_it_declares_varlen():
    c = packed((2, 3), (2, 3))
    assert "varlen (2 packed sequences)" == TILED.caps.why_not(c)
    assert VARLEN.supports(c)
    dense = AttentionCase(batch=2, heads=2, kv_heads=1, seq_q=3, seq_k=3, head_dim=8)
    assert "dense case" in VARLEN.caps.why_not(dense)
    no_zero = dataclasses.replace(VARLEN.caps, zero_length=False)
    assert "a sequence of length 0" in no_zero.why_not(packed((2, 0), (2, 1)))


# -- the packed call --------------------------------------------------------------------------
def test_the_call_hands_over_packed_views_and_views_the_answer_back():
    c = packed((3, 0, 2), (1, 4, 2), heads=4, kv_heads=2)
    recording = RecordingKernel(torch_varlen_forward)
    impl = Implementation("recording", recording, VARLEN.caps)
    inputs = materialize(c)
    out, lse = impl(*inputs.tensors(), c)
    (call,) = recording.calls
    assert tuple(call.q.shape) == (5, 4, 8) and tuple(call.k.shape) == (7, 2, 8)
    assert call.q.data_ptr() == inputs.q.data_ptr()          # a view: no copy
    assert call.kwargs["cu_seqlens_q"].dtype == torch.int32
    assert call.kwargs["cu_seqlens_q"].tolist() == [0, 3, 3, 5]
    assert call.kwargs["cu_seqlens_k"].tolist() == [0, 1, 5, 7]
    assert (call.kwargs["max_seqlen_q"], call.kwargs["max_seqlen_k"]) == (3, 4)
    assert tuple(out.shape) == (1, 4, 5, 8) and tuple(lse.shape) == (1, 4, 5)


def test_lse_laid_out_per_row_is_a_contract_error():
    c = packed((2,), (2,), heads=3)

    def lse_per_row(q, k, v, **kw):
        out, lse = torch_varlen_forward(q, k, v, **kw)
        return out, lse.transpose(0, 1).contiguous()      # (total_q, Hq): not FA's (Hq, total_q)

    with pytest.raises(ContractError, match=r"packed lse of shape \(2, 3\); expected \(3, 2\)"):
        Implementation("bad", lse_per_row, VARLEN.caps)(*materialize(c).tensors(), c)


@pytest.mark.parametrize("cu_q, cu_k, max_q, message", [
    pytest.param([0, 2, 3], [0, 1, 4], 2, None, id="valid"),
    pytest.param([1, 2, 3], [0, 1, 4], 2, "cu_seqlens_q", id="cu_q-not-from-0"),
    pytest.param([0, 2, 4], [0, 1, 4], 2, "cu_seqlens_q", id="cu_q-past-total"),
    pytest.param([0, 2, 1, 3], [0, 1, 2, 4], 2, "cu_seqlens_q", id="cu_q-decreasing"),
    pytest.param([0, 3], [0, 4], 2, "max_seqlen_q", id="max_seqlen_q-too-small"),
    pytest.param([0, 3], [0, 1, 4], 3, "cu_seqlens_k", id="counts-differ"),
])
def test_a_malformed_packed_call_is_refused_in_one_line(cu_q, cu_k, max_q, message):
    q, k = torch.zeros(3, 1, 8), torch.zeros(4, 1, 8)
    call = lambda: check_packed(q, k, k, torch.tensor(cu_q, dtype=torch.int32),   # noqa: E731
                                torch.tensor(cu_k, dtype=torch.int32), max_q, 4, refuse)
    if message is None:
        assert call() == (cu_q, cu_k)
    else:
        with pytest.raises(UnsupportedCaseError, match=message):
            call()


# -- the oracle -------------------------------------------------------------------------------
@pytest.mark.parametrize("causal, window", [("none", (-1, -1)), ("bottom_right", (-1, -1)),
                                            ("top_left", (1, 0)), ("none", (0, 2))])
def test_the_packed_oracle_is_each_sequence_alone(causal, window):
    c = packed((3, 0, 5, 2, 1), (4, 2, 1, 2, 0), heads=4, kv_heads=2, causal=causal,
               window=window)
    q, k, v = (t.double() for t in materialize(c).tensors())
    whole = oracle(q, k, v, c)
    for q0, q1, k0, k1 in spans(c):
        alone = c.replace(**relengthed((q1 - q0,), (k1 - k0,)))
        ref = oracle(q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], alone)
        # float64 both: they differ only in the matmuls' summation order (~1e-16)
        torch.testing.assert_close(whole.out[:, :, q0:q1], ref.out, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(whole.lse[:, :, q0:q1], ref.lse, rtol=1e-12, atol=1e-12)
    # the last sequence has no keys: its row 10 is empty, out 0 and lse -inf
    assert bool(whole.empty_rows[10]) and whole.some_empty
    assert torch.isneginf(whole.lse[..., 10]).all() and (whole.out[..., 10, :] == 0).all()


def test_the_reference_passes_with_its_gradients_judged():
    c = packed((3, 1, 17), (5, 2, 16), causal="bottom_right", window=(3, -1), dtype="bfloat16")
    report = judge(VARLEN, c)
    assert report.passed, report.describe()
    assert {"out", "lse", "grad_dq", "grad_dk"} <= {v.check for v in report.verdicts}


def _packed_backward(q, k, v, out, lse, dout, **kw):
    """An explicit backward as a varlen kernel offers one: packed tensors in, packed out."""
    assert q.dim() == 3 and tuple(lse.shape) == (q.shape[1], q.shape[0]) and out.dim() == 3
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        o, _ = torch_varlen_forward(*leaves, **kw)
        grads = torch.autograd.grad(o, leaves, dout, allow_unused=True)
    return tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves))


def test_an_explicit_backward_gets_the_packed_call_too():
    impl = Implementation("explicit", torch_varlen_forward, VARLEN.caps,
                          backward_fn=_packed_backward)
    report = judge(impl, packed((2, 0, 3), (3, 1, 3), causal="bottom_right"))
    assert report.passed, report.describe()
    assert {"grad_dq", "grad_dk", "grad_dv"} <= {v.check for v in report.verdicts}


# -- the draws --------------------------------------------------------------------------------
@settings(max_examples=60, database=None)
@given(attention_cases(VARLEN.caps, profile=profiles.PROFILES["ci"]))
def test_a_varlen_declaration_draws_packed_cases_inside_it(c):
    assert c.varlen and VARLEN.supports(c), VARLEN.caps.why_not(c)
    assert 1 <= len(c.seqlens_q) <= 3 * profiles.PROFILES["ci"].max_batch


@settings(max_examples=30, database=None)
@given(attention_cases(TILED.caps, profile=profiles.PROFILES["ci"]))
def test_other_declarations_never_draw_packed_cases(c):
    assert not c.varlen


NARROW = dataclasses.replace(VARLEN.caps, zero_length=False, gqa=False, equal_lengths=True,
                             causal=("bottom_right",))


@settings(max_examples=40, database=None)
@given(undeclared_cases(NARROW, profile=profiles.PROFILES["ci"]))
def test_undeclared_edits_land_on_one_packed_sequence(drawn):
    what, c = drawn
    assert c.varlen and NARROW.why_not(c) is not None, (what, c)


def test_shrinking_goes_to_the_fewest_shortest_sequences():
    # What a leak needs: a second sequence holding a key.
    found = find(packed_lengths(seq_shapes(max_len=40, allow_zero=True), max_sequences=6,
                                allow_zero=True),
                 lambda lengths: len(lengths[0]) >= 2 and sum(lengths[1][1:]) > 0,
                 settings=settings(database=None, max_examples=500))
    assert found == ((1, 1), (1, 1)), found


# -- mutants, the leak relation, files, predicates --------------------------------------------
@pytest.mark.parametrize("name", VARLEN_MUTANTS)
def test_a_small_campaign_kills_each_varlen_mutant(name):
    assert killing_case(name).varlen


def test_sequence_isolation_names_a_leak_and_holds_for_the_reference():
    # Only sequence 0 has queries, and sequence 1 has the key it would leak.
    c = packed((2, 0), (2, 1))
    relation = RELATIONS["sequence_isolation"]
    assert relation(VARLEN, c, "cpu").passed
    verdict = relation(mutants()["mutant_varlen_reads_next_sequence"], c, "cpu")
    assert not verdict.passed and verdict.check == "metamorphic:sequence_isolation"
    assert relation(TILED, AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=2, seq_k=2,
                                         head_dim=8), "cpu") is None
    for name in ("key_permutation", "causal_prefix"):       # packing breaks them
        assert RELATIONS[name](VARLEN, c.replace(causal="bottom_right"), "cpu") is None


@pytest.mark.parametrize("name", VARLEN_MUTANTS)
def test_each_varlen_mutant_ships_a_file_that_catches_it(name):
    files = shipped(name)
    assert files, f"no regression file for {name}"
    for fixture in files:
        assert fixture.case.varlen and fixture.case.key() in {p.stem for p in REGRESSIONS.iterdir()}
        assert_catches_only_the_mutant(fixture, name, VARLEN)


def test_packed_predicates_replace_the_total_lengths_ones():
    c = packed((1, 0, 2), (3, 1, 1))
    found = {name: variants for name, _, variants in one_change_variants(c, VARLEN.caps)}
    assert MANY_SEQUENCES in found and EMPTY_SEQUENCE in found
    assert "lengths" not in found and "Nk odd" not in found
    assert [v.seqlens_q for v in found[MANY_SEQUENCES]] == [(1,), (0,), (2,)]
    assert found[EMPTY_SEQUENCE][0].seqlens_q == (1, 1, 2)
    assert factors(packed((2,), (3,), heads=1), VARLEN.caps) == {}  # one, none empty: plain


def test_undoing_two_sequence_predicates_together_gives_a_case():
    """Both change the lengths: undone one after the other, not merged field by field (found on
    the H200: the first sequence's q lengths beside every sequence's k lengths, a CaseError that
    ended the campaign)."""
    c = packed((3, 1, 2), (4, 0, 2), heads=1)
    trigger = {MANY_SEQUENCES: "", EMPTY_SEQUENCE: ""}
    assert set(trigger) <= set(factors(c, VARLEN.caps))
    cure = cured(c, trigger, VARLEN.caps)
    assert (cure.seqlens_q, cure.seqlens_k) == ((3,), (4,))    # the first sequence alone
    assert not set(trigger) & set(factors(cure, VARLEN.caps))
    cure = cured(c, dict(reversed(trigger.items())), VARLEN.caps)
    assert (cure.seqlens_q, cure.seqlens_k) == ((3,), (4,))    # lengths 0 made 1, then alone


def test_explain_names_the_sequences_a_predicate_keeps():
    c = packed((1, 2), (1, 1))
    rows = [row.changed_to for row in explain_variants(VARLEN, c) if row.factor == MANY_SEQUENCES]
    assert rows == ["seqlens=1/1", "seqlens=2/1"]          # each sequence alone


def test_a_cause_shrinks_toward_fewer_then_shorter_sequences():
    c = packed((4, 2, 6), (4, 2, 6))
    shrunk = candidates(c, VARLEN.caps)
    assert shrunk[0].seqlens_q == (4,)                        # the first half
    assert any(s.seqlens_q == (2, 6) for s in shrunk)         # one sequence dropped
    assert any(s.seqlens_q == (2, 1, 3) for s in shrunk)      # every length halved
    assert all(VARLEN.supports(s) for s in shrunk)
