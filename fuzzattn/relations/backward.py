"""Metamorphic relations for gradients: identities between two gradient runs of one
implementation, no oracle needed, so they run at lengths too large for the float64 gradient
oracle (`Profile.metamorphic_seq`).

    grad_key_permutation     non-causal: permuting k and v rows together leaves dq unchanged and
                             permutes dk and dv the same way.
    grad_batch_independence  each batch element's gradients computed alone (q, k, v, dO sliced
                             b:b+1, views of the case's layout) equal its slice of the batched ones.

Each run is the contract's gradient call (`execute.call_gradients`): an explicit backward gets
the forward's out and lse of the same run's inputs. dO is the case's (`inputs.materialize_dout`).
Verdicts are "metamorphic:<relation>", built like the forward relations' (relations/forward.py).

Tolerance: the gradient rule's noise terms (tolerance.grad_noise) for each of the two runs, per
row: with T, T_delta, T_mag the row's largest sums of term magnitudes (gradients.reference_gradients.
term_magnitudes), computed here in fp32 from a softmax of the run's own inputs and its own out
(no float64, no oracle gradients): a correct kernel's run is within that of exact gradients, so
two runs are within the sum. The K x reference term has no counterpart (no reference runs),
so each run adds the absolute rounding a dtype makes below its normal range, half a subnormal
step (2^-25 for fp16).
"""
from __future__ import annotations

import torch

from fuzzattn.contract.alibi import alibi_bias, alibi_slopes
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.implementation import Implementation
from fuzzattn.run import execute
from fuzzattn.gradients.reference_gradients import NAMES, term_magnitudes
from fuzzattn.inputs.materialize import materialize, materialize_dout
# The forward relations' transformed inputs, and the machinery every relation shares: the same
# verdict shape, crash and refusal handling.
from fuzzattn.relations.forward import _transformed
from fuzzattn.relations.two_runs import (RunRefused, RunFailed, as_relation, case_generator,
                                           relation_verdict, row_errors, run_once)
from fuzzattn.judging.oracle import case_visible_keys
from fuzzattn.judging.tolerance import grad_noise
from fuzzattn.judging.verdict import Verdict


def _gradients(impl: Implementation, q, k, v, dout, case: AttentionCase, which: str):
    """dict of dq, dk, dv (and row noise bounds) from one run; raises RunFailed on a crash."""
    out, lse = run_once(impl, q, k, v, case, f"{which} forward")
    call = execute.call_gradients(impl, q, k, v, dout, case, out=out, lse=lse)
    if call.declared_refusal:
        raise RunRefused(call.summary)
    if not call.answered:
        raise RunFailed(f"{which} gradient run raised {call.summary}")
    grads = dict(zip(NAMES, call.grads))
    return grads, _row_noise(impl, q, k, v, out, dout, case)


def _row_noise(impl, q, k, v, out, dout, case: AttentionCase) -> dict[str, torch.Tensor]:
    """Per gradient row, the rule's noise for one run: grad_noise x max over the row of T."""
    qf, kf = q.to(torch.float32), k.to(torch.float32)
    ke = kf.repeat_interleave(case.group_size, dim=1) if case.group_size > 1 else kf
    s = (qf @ ke.transpose(-1, -2)) * case.softmax_scale
    if case.softcap:
        s = case.softcap * torch.tanh(s / case.softcap)
    magnitude = (qf.abs() @ ke.abs().transpose(-1, -2)) * abs(case.softmax_scale)
    if case.alibi:          # after the cap, and one more term of each score (oracle._attend)
        bias = alibi_bias(alibi_slopes(case.alibi, case.heads, q.device), case.seq_q, case.seq_k,
                          torch.float32)
        s, magnitude = s + bias, magnitude - bias
    mask = case_visible_keys(case, q.device)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
        magnitude = magnitude.masked_fill(~mask, 0.0)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)        # rows with no key: all zero
    score = float(magnitude.max()) if magnitude.numel() else 0.0
    out = torch.where(torch.isfinite(out), out, torch.zeros_like(out))
    terms = term_magnitudes(q, k, v, out, dout, p, case)
    sums = {"dq": case.seq_k, "dk": case.seq_q * case.group_size, "dv": case.seq_q * case.group_size}
    # Below the dtype's smallest normal number its rounding is absolute: half a subnormal step
    # each run, which no relative term covers and no reference error stands in for here (seen:
    # torch_tiled fp16 dv of a dominant_key case, keys permuted, one step of 5.96e-8 apart with
    # 2.96e-10 allowed: B=1 H=1 Nq=1 Nk=23 D=16, data_seed=1). The operands a backward rounds to
    # the dtype before its sums (P for dv, dS for dq and dk) are off by up to that half step too,
    # each term of the sum times the other operand (seen: dv 4 steps apart, dk 2, with Nq=41
    # Nk=41 D=16, data_seed=0): per gradient row, half a step times the other operand's rows summed.
    finfo = torch.finfo(q.dtype)
    subnormal_half_step = 0.5 * finfo.tiny * finfo.eps
    scale = abs(case.softmax_scale)

    def rows_summed(x):          # (B, H, N, D) -> (B, H): sum over rows of the row's largest |x|
        return x.abs().to(torch.float64).amax(dim=-1).sum(dim=-1)

    def per_kv_head(x):          # (B, Hq) -> (B, Hkv): a key row's sums run over its group's heads
        return x.unflatten(1, (-1, case.group_size)).sum(dim=-1) if case.group_size > 1 else x

    rounded_operands = {"dv": per_kv_head(rows_summed(dout)),
                        "dk": scale * per_kv_head(rows_summed(qf)),
                        "dq": scale * rows_summed(kf).repeat_interleave(case.group_size, dim=1)}
    noise = {}
    for name in NAMES:
        coeffs = grad_noise(q.dtype, impl.caps.fp32_matmul, score, sums[name])
        t = terms[name]
        noise[name] = sum(c * x.to(torch.float64).amax(dim=-1)
                          for c, x in zip(coeffs, (t.actual, t.delta, t.magnitude))) \
            + subnormal_half_step * (1.0 + rounded_operands[name][..., None])
    return noise


def _compare(name, impl, case, got, noise, expected, expected_noise, note="") -> Verdict:
    parts = []
    for g in NAMES:
        errors = row_errors(got[g], expected[g])
        rows = torch.ones_like(errors, dtype=torch.bool)
        parts.append((g, errors, noise[g] + expected_noise[g], rows))
    return relation_verdict(name, impl, case, parts, note=note)


@as_relation("grad_key_permutation")
def grad_key_permutation(impl, case, device):
    """Non-causal: k and v rows permuted together (one permutation from the case's data seed,
    never the identity): dq unchanged, dk and dv permuted by the same permutation."""
    if case.is_causal or case.seq_k < 2 or case.seq_q == 0:
        return None
    inputs = materialize(case, device)
    _, dout = materialize_dout(case, device)
    perm = torch.randperm(case.seq_k, generator=case_generator(case))
    if bool((perm == torch.arange(case.seq_k)).all()):
        perm = perm.roll(1)
    perm = perm.to(device)
    base, base_noise = _gradients(impl, *inputs.tensors(), dout, case, "first")
    moved = _transformed(case, device, k=inputs.k[:, :, perm], v=inputs.v[:, :, perm])
    _, dout2 = materialize_dout(case, device)
    got, noise = _gradients(impl, *moved.tensors(), dout2, case, "permuted")
    expected = {"dq": base["dq"], "dk": base["dk"][:, :, perm], "dv": base["dv"][:, :, perm]}
    expected_noise = {"dq": base_noise["dq"], "dk": base_noise["dk"][:, :, perm],
                      "dv": base_noise["dv"][:, :, perm]}
    return _compare("grad_key_permutation", impl, case, got, noise, expected, expected_noise,
                    note="dq must not change; dk, dv rows must move with their keys")


@as_relation("grad_batch_independence")
def grad_batch_independence(impl, case, device):
    """Batch element b's gradients computed alone (q, k, v, dO sliced b:b+1, views of the case's
    layout) equal the batched gradients' slice b."""
    if case.batch < 2 or case.seq_q == 0:
        return None
    inputs = materialize(case, device)
    _, dout = materialize_dout(case, device)
    batched, noise = _gradients(impl, *inputs.tensors(), dout, case, "batched")
    alone, alone_noise = {g: [] for g in NAMES}, {g: [] for g in NAMES}
    one = case.replace(batch=1)
    for b in range(case.batch):
        sliced = (t[b:b + 1] for t in (*inputs.tensors(), dout))
        grads, n = _gradients(impl, *sliced, one, f"batch element {b}")
        for g in NAMES:
            alone[g].append(grads[g])
            alone_noise[g].append(n[g])
    alone = {g: torch.cat(alone[g]) for g in NAMES}
    alone_noise = {g: torch.cat(alone_noise[g]) for g in NAMES}
    return _compare("grad_batch_independence", impl, case, alone, alone_noise, batched, noise)


GRAD_RELATIONS = {"grad_key_permutation": grad_key_permutation,
                  "grad_batch_independence": grad_batch_independence}


def check_grad_relations(impl: Implementation, case: AttentionCase, device=None) -> list[Verdict]:
    """The verdict of every gradient relation that applies (implementations declaring backward)."""
    if not impl.caps.backward:
        return []
    return [v for relation in GRAD_RELATIONS.values()
            if (v := relation(impl, case, device)) is not None]
