"""Gradient metamorphic relations (fuzzattn/relations/backward.py): every implementation declaring
`backward` obeys them, and each catches a purpose-built bad backward that breaks it (and passes
the other).

Budgets are small: the interpreted Triton backward runs twice per relation (three times for
batch independence), about a second each on small cases.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import assume, given, settings

from fuzzattn import AttentionCase, Capabilities, Implementation
from fuzzattn.contract import profiles
from fuzzattn.relations.backward import GRAD_RELATIONS, check_grad_relations
from fuzzattn.judgement.judge import default_device
from fuzzattn.run.registry import implementations
from fuzzattn.triton_interpreter.backend import is_interpreted
from fuzzattn.kernels.sdpa import sdpa_forward
from fuzzattn.strategies import attention_cases
from fuzzattn.campaigns.compile_palette import campaign_palette

DEVICE = default_device()
BACKWARD = [impl for impl in implementations().values() if impl.caps.backward]


def _budget(impl: Implementation) -> int:
    if impl.backend == "triton" and is_interpreted():
        return 3
    return max(6, profiles.active().max_examples // 25)


def _cases(relation: str, impl: Implementation):
    p = profiles.active()
    profile = dataclasses.replace(p, max_large_seq=max(p.max_seq, p.metamorphic_seq))
    caps = impl.caps
    if relation == "grad_key_permutation":
        caps = dataclasses.replace(caps, causal=())
    if is_interpreted() and impl.backend == "triton":
        caps = dataclasses.replace(caps, dtypes=caps.dtypes - {"bfloat16"})   # repaired dot: slow
    # Compiled kernels draw from one compile palette, as their campaigns do.
    cases = attention_cases(caps, profile=profile, palette=campaign_palette(impl, 0))
    if relation == "grad_batch_independence":
        cases = cases.map(lambda c: c if c.batch >= 2 else c.replace(batch=2))
    return cases


@pytest.mark.parametrize("relation", list(GRAD_RELATIONS))
@pytest.mark.parametrize("impl", BACKWARD, ids=lambda impl: impl.name)
def test_real_backward_obeys(impl, relation):
    check = GRAD_RELATIONS[relation]
    if impl.caps.varlen and relation in ("grad_key_permutation", "grad_batch_independence"):
        pytest.skip("a packed case breaks it, or has one batch element (relations/two_runs.py)")

    @settings(max_examples=_budget(impl))
    @given(case=_cases(relation, impl))
    def obeys(case):
        verdict = check(impl, case, DEVICE)
        assume(verdict is not None)
        assert verdict.passed, verdict.describe()

    obeys()


# -- purpose-built bad backwards --------------------------------------------------------------
CAPS = Capabilities(dtypes={"float32"}, head_dims=None, causal=("top_left",), gqa=True,
                    backward=True)


def _sdpa_grads(q, k, v, dout, causal, scale):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        o, _ = sdpa_forward(*leaves, causal=causal, scale=scale)
        return torch.autograd.grad(o, leaves, dout)


def _dv_by_position(q, k, v, out, lse, dout, *, causal, scale):
    """dv of key position 0 gets a bump: tied to the position, not to the key."""
    dq, dk, dv = _sdpa_grads(q, k, v, dout, causal, scale)
    dv = dv.clone()
    dv[:, :, 0] += 0.5
    return dq, dk, dv


def _dq_mixes_batch(q, k, v, out, lse, dout, *, causal, scale):
    """dq of every batch element gets a little of the batch mean: elements interact."""
    dq, dk, dv = _sdpa_grads(q, k, v, dout, causal, scale)
    return dq + 0.25 * (dq.mean(dim=0, keepdim=True) - dq), dk, dv


@pytest.mark.parametrize("relation,fn,other", [
    ("grad_key_permutation", _dv_by_position, "grad_batch_independence"),
    ("grad_batch_independence", _dq_mixes_batch, "grad_key_permutation")])
def test_each_relation_catches_its_bad_backward(relation, fn, other):
    impl = Implementation(f"bad_{relation}", sdpa_forward, CAPS, backward_fn=fn)
    c = AttentionCase(batch=2, heads=2, kv_heads=1, seq_q=5, seq_k=7, head_dim=16, data_seed=3)
    verdicts = {v.check: v for v in check_grad_relations(impl, c, DEVICE)}
    assert not verdicts["metamorphic:" + relation].passed
    assert verdicts["metamorphic:" + other].passed, verdicts["metamorphic:" + other].describe()


def test_two_runs_a_subnormal_step_apart_obey_the_relation():
    """Found by a dev-profile run: with the keys permuted, torch_tiled's fp16 dv of a
    dominant_key case came out one fp16 subnormal step (2^-24) away, where the relative noise
    terms allowed 2.96e-10. Below the normal range the dtype's rounding is absolute."""
    case = AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=1, seq_k=23, head_dim=16,
                         dtype="float16", values="dominant_key", data_seed=1)
    verdict, = check_grad_relations(implementations()["torch_tiled"], case, "cpu")
    assert verdict.check == "metamorphic:grad_key_permutation"
    assert verdict.error == 2.0 ** -24 and verdict.passed, verdict.describe()
    assert verdict.allowed < 2 * 2.0 ** -24       # one step, not a blanket allowance


def test_operands_rounded_below_the_normal_range_are_allowed_their_steps():
    """Found on the H200 by a dev-profile run, and the same on the CPU: keys permuted, torch_tiled's
    fp16 dv came out 4 subnormal steps away and dk 2 (P and dS rounded to fp16 in the sums over
    41 rows), where one step per run was allowed."""
    case = AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=41, seq_k=41, head_dim=16,
                         dtype="float16", values="dominant_key", data_seed=0)
    verdict, = check_grad_relations(implementations()["torch_tiled"], case, "cpu")
    assert verdict.check == "metamorphic:grad_key_permutation"
    assert verdict.passed and verdict.error >= 2 * 2.0 ** -24, verdict.describe()
    assert verdict.allowed < 64 * 2.0 ** -24      # steps, nothing of the values' own size


def test_relations_apply_only_to_implementations_declaring_backward():
    impl = Implementation("fwd", sdpa_forward, dataclasses.replace(CAPS, backward=False))
    c = AttentionCase(batch=2, heads=1, kv_heads=1, seq_q=3, seq_k=3, head_dim=16)
    assert check_grad_relations(impl, c, DEVICE) == []
