"""Metamorphic relations: every registered implementation obeys them, and each relation catches a
purpose-built bad implementation that breaks that relation and no other.

The properties draw longer sequences than the differential test now and then (up to the profile's
metamorphic_seq), since no float64 oracle runs. Budgets are an eighth of the profile's cases per
test, a third of that under Triton's interpreter, so the "ci" profile fits a 2-core CPU.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from fuzzattn.contract import profiles
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract import Capabilities, Implementation
from fuzzattn.triton_interpreter.backend import is_interpreted
from fuzzattn.judgement.judge import default_device, skip_reason
from fuzzattn.relations.forward import RELATIONS, check_relations
from fuzzattn.relations.two_runs import BROKEN_BY
from fuzzattn.run.registry import implementations
from fuzzattn.strategies import attention_cases
from fuzzattn.campaigns.compile_palette import campaign_palette

DEVICE = default_device()
REAL = list(implementations().values())


# -- the real implementations obey every relation -------------------------------------------------
def _profile() -> profiles.Profile:
    """The active profile, with its occasional long sequences reaching metamorphic_seq."""
    p = profiles.active()
    return dataclasses.replace(p, max_large_seq=max(p.max_seq, p.metamorphic_seq))


def _budget(impl: Implementation) -> int:
    examples = max(10, profiles.active().max_examples // 8)
    if impl.backend == "triton" and is_interpreted():
        examples //= 3               # ~10 ms per 16x16 tile step under the interpreter
    if impl.caps.compiles_per_shape:
        examples = 3                 # a relation's derived shapes each compile (10-40 s on a CPU)
    return examples


def _runnable_caps(impl: Implementation) -> Capabilities:
    """The declared capabilities minus dtypes this machine cannot judge (e.g. bf16 Triton under
    an interpreter whose dot could not be repaired)."""
    packed = dict(seqlens_q=(16,), seqlens_k=(16,)) if impl.caps.varlen else {}
    probe = AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=16, seq_k=16, head_dim=16, **packed)
    dtypes = {d for d in impl.caps.dtypes if skip_reason(impl, probe.replace(dtype=d)) is None}
    if not dtypes:
        pytest.skip(skip_reason(impl, probe.replace(dtype=sorted(impl.caps.dtypes)[0])))
    return dataclasses.replace(impl.caps, dtypes=frozenset(dtypes))


def _cases(relation: str, impl: Implementation):
    """Cases the relation applies to, within what the implementation declares."""
    caps = _runnable_caps(impl)
    if relation == "key_permutation":
        caps = dataclasses.replace(caps, causal=())
    if relation == "causal_prefix" and not caps.causal:
        pytest.skip(f"{impl.name} declares no causal alignment")
    # Compiled kernels draw from one compile palette, as their campaigns do.
    cases = attention_cases(caps, profile=_profile(), palette=campaign_palette(impl, 0))
    if relation == "batch_independence":
        cases = cases.map(lambda c: c if c.batch >= 2 else c.replace(batch=2))
    if relation == "causal_prefix":
        cases = st.tuples(cases, st.sampled_from(caps.causal)).map(
            lambda pair: pair[0].replace(causal=pair[1]))
    return cases


@pytest.mark.parametrize("relation", list(RELATIONS))
@pytest.mark.parametrize("impl", REAL, ids=lambda impl: impl.name)
def test_real_implementation_obeys(impl, relation):
    check = RELATIONS[relation]
    if impl.caps.varlen and relation in BROKEN_BY["varlen"] + ("batch_independence",):
        pytest.skip("a packed case breaks it, or has one batch element (relations/two_runs.py)")
    if relation == "sequence_isolation" and not impl.caps.varlen:
        pytest.skip("packed cases only")

    @settings(max_examples=_budget(impl))
    @given(case=_cases(relation, impl))
    def obeys(case):
        verdict = check(impl, case, DEVICE)
        assume(verdict is not None)          # e.g. a cut that leaves no causal row to check
        assert verdict.passed, verdict.describe()

    obeys()


# -- purpose-built bad implementations, each breaking exactly one relation ------------------------
ANY = Capabilities(dtypes={"float32", "bfloat16", "float16"}, head_dims=None,
                   causal=("top_left", "bottom_right"), gqa=True, strides="any")


def _attention(q, k, v, *, causal, scale, bias=None, extra_diagonal=0, divide_by_count=False):
    """Plain fp32 softmax attention with hooks for the planted bugs; out 0 / lse -inf for rows
    that see no key. bias(scores, q, k) returns what is added to the (B, H, Nq, Nk) scores."""
    heads, kv_heads = q.shape[1], k.shape[1]
    qf = q.float()
    kf = k.float().repeat_interleave(heads // kv_heads, dim=1)
    vf = v.float().repeat_interleave(heads // kv_heads, dim=1)
    scores = (qf @ kf.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias(qf, kf, scale)
    nq, nk = scores.shape[-2:]
    visible = torch.ones(nq, nk, dtype=torch.bool, device=q.device)
    if causal:
        offset = 0 if causal == "top_left" else nk - nq
        visible = visible.tril(diagonal=offset + extra_diagonal)
    scores = scores.masked_fill(~visible, -math.inf)
    m = scores.amax(dim=-1, keepdim=True)
    m = torch.where(m == -math.inf, torch.zeros_like(m), m)
    p = torch.exp(scores - m)
    l = p.sum(dim=-1, keepdim=True)
    norm = visible.sum(dim=-1, keepdim=True).float() if divide_by_count else l
    out = (p @ vf) / torch.where(norm == 0, torch.ones_like(norm), norm)
    lse = (m + torch.log(l)).squeeze(-1)
    return out.to(q.dtype), lse


def _alibi_left_on(q, k, v, *, causal, scale):
    """A linear distance penalty (ALiBi, slope 1/4) applied where no bias was asked for."""
    def distance(qf, kf, scale):
        i = torch.arange(qf.shape[-2], device=qf.device)[:, None]
        j = torch.arange(kf.shape[-2], device=qf.device)[None, :]
        return -0.25 * (i - j).abs().float()
    return _attention(q, k, v, causal=causal, scale=scale, bias=distance)


def _kv_batch_stride_ignored(q, k, v, *, causal, scale):
    """Every batch element reads the keys and values of batch element 0 (a dropped batch stride)."""
    return _attention(q, k[:1].expand_as(k), v[:1].expand_as(v), causal=causal, scale=scale)


def _divides_by_key_count(q, k, v, *, causal, scale):
    """The final normalisation divides by the number of visible keys instead of the sum l."""
    return _attention(q, k, v, causal=causal, scale=scale, divide_by_count=True)


def _distance_scores(q, k, v, *, causal, scale):
    """Scores -scale |q - k|^2 / 2 (distance attention) instead of scale q.k: the per-row |q|^2
    cancels in the softmax, the per-key |k|^2 does not."""
    def key_norm(qf, kf, scale):
        return -0.5 * scale * (kf * kf).sum(dim=-1)[..., None, :]
    return _attention(q, k, v, causal=causal, scale=scale, bias=key_norm)


def _sees_next_key(q, k, v, *, causal, scale):
    """Causal mask off by one: row i also sees the key just after its last visible one."""
    return _attention(q, k, v, causal=causal, scale=scale, extra_diagonal=1 if causal else 0)


BREAKS = {
    "key_permutation": _alibi_left_on,
    "batch_independence": _kv_batch_stride_ignored,
    "value_shift": _divides_by_key_count,
    "score_shift": _distance_scores,
    "causal_prefix": _sees_next_key,
}

BAD_CASES = [
    AttentionCase(batch=2, heads=2, kv_heads=1, seq_q=37, seq_k=45, head_dim=32, dtype=dtype,
                  causal=causal, layout=layout, data_seed=seed)
    for seed, (dtype, causal, layout) in enumerate([
        ("float32", "none", ("contiguous",) * 3),
        ("bfloat16", "none", ("transposed", "broadcast_batch", "sliced")),
        ("float32", "top_left", ("contiguous",) * 3),
        ("float16", "bottom_right", ("sliced", "contiguous", "broadcast_heads")),
        ("bfloat16", "bottom_right", ("contiguous",) * 3),
    ])
]


@pytest.mark.parametrize("case", BAD_CASES, ids=str)
@pytest.mark.parametrize("relation", list(BREAKS))
def test_relation_catches_the_bad_implementation_that_breaks_it(relation, case):
    bad = Implementation(name=f"bad_{relation}", fn=BREAKS[relation], caps=ANY,
                         description="purpose-built bad implementation")
    verdicts = {v.check.split(":", 1)[1]: v for v in check_relations(bad, case, DEVICE)}
    wrongly_failed = [v.describe() for name, v in verdicts.items()
                      if name != relation and not v.passed]
    assert not wrongly_failed, "\n".join(wrongly_failed)
    if relation in verdicts:              # the relation applies to this case
        assert not verdicts[relation].passed, verdicts[relation].describe()


@pytest.mark.parametrize("relation", list(BREAKS))
def test_every_bad_implementation_is_caught_somewhere(relation):
    bad = Implementation(name=f"bad_{relation}", fn=BREAKS[relation], caps=ANY)
    caught = [case for case in BAD_CASES
              if (v := RELATIONS[relation](bad, case, DEVICE)) is not None and not v.passed]
    assert caught, f"{relation} never applied to, or never caught, {bad.name}"


@pytest.mark.parametrize("impl,case", [
    pytest.param(impl, case, id=f"{impl.name}-{case}") for impl in REAL for case in BAD_CASES
    if skip_reason(impl, case) is None])       # only the cases each implementation declares
def test_real_implementations_pass_the_bad_cases(impl, case):
    failed = [v.describe() for v in check_relations(impl, case, DEVICE) if not v.passed]
    assert not failed, "\n".join(failed)


# -- the verdicts themselves ----------------------------------------------------------------------
def test_relations_skip_where_they_do_not_apply():
    sdpa = implementations()["sdpa"]
    causal = AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=8, seq_k=8, head_dim=16,
                           causal="top_left")
    assert RELATIONS["key_permutation"](sdpa, causal, DEVICE) is None
    assert RELATIONS["batch_independence"](sdpa, causal, DEVICE) is None      # batch 1
    assert RELATIONS["causal_prefix"](sdpa, causal.replace(causal="none"), DEVICE) is None
    # An implementation that declares top-left causal only (triton_fa2 did, before it grew
    # bottom-right): the relation skips the alignment it does not declare.
    triton = implementations()["triton_fa2"]
    top_left_only = dataclasses.replace(triton, caps=dataclasses.replace(triton.caps, causal=("top_left",)))
    assert RELATIONS["causal_prefix"](top_left_only, causal.replace(causal="bottom_right"), DEVICE) is None
    names = [v.check for v in check_relations(sdpa, causal.replace(batch=2))]
    assert names == ["metamorphic:batch_independence", "metamorphic:value_shift",
                     "metamorphic:score_shift", "metamorphic:causal_prefix"]


def _raises_on_second_call(message: str):
    """Attention that raises RuntimeError(message) on its second call (a relation's second run)
    and after a reset (`.reset()`), on the second call again."""
    calls = []

    def attention(q, k, v, *, causal, scale):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError(message)
        return _attention(q, k, v, causal=causal, scale=scale)
    attention.reset = calls.clear
    return attention


def test_a_crash_fails_the_relation_with_its_reason():
    bad = Implementation(name="crashes", fn=_raises_on_second_call("boom"), caps=ANY)
    verdict = RELATIONS["key_permutation"](bad, BAD_CASES[0], DEVICE)
    assert not verdict.passed and verdict.detail == "permuted run raised RuntimeError: boom"


def test_a_declared_refusal_means_the_relation_does_not_apply():
    """A backend refusing a declared case the way it declares (an SDPA backend's "No available
    kernel" on CUDA) is a refused draw, as in a campaign: no verdict, neither pass nor failure;
    an undeclared error of the same run still fails the relation."""
    refuses = _raises_on_second_call("No available kernel. Aborting execution.")
    declared = dataclasses.replace(ANY, refusals=("No available kernel",))
    refusing = Implementation(name="refuses", fn=refuses, caps=declared)
    assert RELATIONS["key_permutation"](refusing, BAD_CASES[0], DEVICE) is None
    refuses.reset()
    undeclared = Implementation(name="refuses", fn=refuses, caps=ANY)
    verdict = RELATIONS["key_permutation"](undeclared, BAD_CASES[0], DEVICE)
    assert not verdict.passed and "No available kernel" in verdict.detail


def test_nan_in_both_runs_fails_the_relation():
    def first_row_nan(q, k, v, *, causal, scale):
        out, lse = _attention(q, k, v, causal=causal, scale=scale)
        out[:, :, 0] = math.nan
        return out, lse
    bad = Implementation(name="first_row_nan", fn=first_row_nan, caps=ANY)
    verdict = RELATIONS["batch_independence"](bad, BAD_CASES[0], DEVICE)
    assert not verdict.passed and verdict.where.startswith("b0 h0 rows 0;")


def _tf32_truncating(q, k, v, *, causal, scale):
    """fp32 attention whose matmul operands keep the first 10 explicit mantissa bits, truncated,
    as tensor cores read an fp32 operand (Triton's fp32 tl.dot on a GPU)."""
    def truncated(t):
        return (t.float().contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32).double()
    s = truncated(q) @ truncated(k).transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    p = torch.softmax(s, -1)
    return (truncated(p) @ truncated(v)).float(), torch.logsumexp(s, -1).float()


TF32_TRUNCATING = Implementation("tf32_truncating", _tf32_truncating, Capabilities(
    dtypes={"float32"}, head_dims=None, causal=("top_left",), fp32_matmul="tf32"))


@settings(max_examples=200, deadline=None, database=None)
@given(seed=st.integers(0, 2**32 - 1), k_dim=st.sampled_from([1, 2, 8]))
def test_score_shift_allows_tf32_operands_truncated(seed, k_dim):
    """The H200 failure of triton_fa2 (D=1, one key: lse off by 2.3 x 2^-11 of |q| |k + w|): the
    rounding model takes a TF32 operand as truncated, so a kernel reading its operands that way
    obeys every relation. With round-to-nearest's 2^-11 this kernel failed score_shift."""
    case = AttentionCase(1, 1, 1, 1, 1, k_dim, causal="top_left", data_seed=seed)
    verdicts = check_relations(TF32_TRUNCATING, case, torch.device("cpu"))
    assert "metamorphic:score_shift" in {v.check for v in verdicts}     # judged, not passed over
    assert all(v.passed for v in verdicts), [v.describe() for v in verdicts if not v.passed]
