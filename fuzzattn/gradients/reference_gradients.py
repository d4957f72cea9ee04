"""Reference gradients: the float64 oracle's (autograd) and a same-precision reference's.

Both take the materialised (already rounded) q, k, v and dO. The oracle is the float64 forward
oracle (`oracle.oracle`) differentiated by hand: with P = exp(scale q k^T - lse) (0 where masked and
on rows with no visible key), dV = P^T dO, dS = P (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK =
scale dS^T Q, each of dK and dV summed over its GQA group; under a softcap c, dS is also multiplied
by the cap's slope 1 - tanh^2(scale q k^T / c); an ALiBi bias enters P only. (Autograd of the
forward oracle gives the same values to float64 rounding; by hand, P and dO V^T serve the term
magnitudes the gradient rule needs too, and no graph is built. tests/gradients/test_gradients.py checks it
against a textbook autograd.) It shares no code with any implementation.

The same-precision reference is what a careful FlashAttention-2 backward computes at the input
precision (and what the kernels' precision contract is): fp32 scores, P = exp(S - lse) from the
reference forward's lse, Delta = rowsum(dO * O) with the reference forward's O rounded to the
input dtype, dS = P (dO V^T - Delta), with P and dS rounded to the input dtype as matmul operands
(TF32-truncated operands for TF32 implementations), fp32 accumulation, gradients rounded to the
input dtype. Its error against the oracle is the "K x reference error" of the tolerance rule.
"""
from __future__ import annotations

import dataclasses

import torch

from fuzzattn.contract.alibi import alibi_bias, alibi_slopes
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.dtypes import reads_tf32
from fuzzattn.judging.placement import judging
from fuzzattn.judging.oracle import (Reference, _attend, same_precision_reference,
                                   truncate_to_tf32, case_visible_keys)

NAMES = ("dq", "dk", "dv")


@dataclasses.dataclass
class GradReference:
    grads: dict[str, torch.Tensor]      # dq (B, Hq, Nq, D); dk, dv (B, Hkv, Nk, D)
    empty_rows: torch.Tensor            # (Nq,) bool: rows that see no key
    unseen_keys: torch.Tensor           # (Nk,) bool: keys no row sees
    score_magnitude: float = 0.0        # as Reference.score_magnitude
    # Per gradient, the sums of term magnitudes its rounding noise scales with (float64; the
    # oracle's only): tolerance.grad_allowance.
    terms: dict = dataclasses.field(default_factory=dict)


def _mask(case: AttentionCase, device) -> torch.Tensor:
    mask = case_visible_keys(case, device)
    if mask is None:
        mask = torch.ones(case.seq_q, case.seq_k, dtype=torch.bool, device=device)
    return mask


def _group_sum(t: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(B, Hq, N, D) -> (B, Hkv, N, D): sum over the query heads that share a kv head."""
    b, hq, n, d = t.shape
    return t.reshape(b, kv_heads, hq // kv_heads, n, d).sum(dim=2)


def _expand(t: torch.Tensor, heads: int) -> torch.Tensor:
    return t.repeat_interleave(heads // t.shape[1], dim=1) if t.shape[1] != heads else t


def _probabilities(q, k, case: AttentionCase, lse: torch.Tensor, mask):
    """(P, slope): P = exp(S - lse), masked, in q's (compute) dtype, 0 on rows with no key,
    where S = scale q k^T, softcapped and biased as the forward does; slope = dS / d(scale q k^T),
    the softcap's 1 - tanh^2 (None without a softcap: 1 everywhere)."""
    # In place on this function's own temporaries (as oracle._attend: fresh float64 pages on the
    # host cost as much as the arithmetic); the same operations, the same bits.
    s = (q @ _expand(k, case.heads).transpose(-1, -2)).mul_(case.softmax_scale)
    slope = None
    if case.softcap:
        t = s.div_(case.softcap).tanh_()
        slope = 1.0 - t * t
        s = t.mul_(case.softcap)
    if case.alibi:          # a constant of q and k: it moves P, not the chain rule
        s.add_(alibi_bias(alibi_slopes(case.alibi, case.heads, q.device), case.seq_q,
                          case.seq_k, s.dtype))
    s.masked_fill_(~mask, float("-inf"))
    lse = lse.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)     # not in place: the caller's lse
    return s.sub_(lse[..., None]).exp_(), slope


@dataclasses.dataclass
class Terms:
    """Per gradient entry, sums of term magnitudes (what its rounding noise scales with)."""
    actual: torch.Tensor      # sum of |terms| as computed: |dS| (or P) times |k|, |q| or |dO|
    magnitude: torch.Tensor   # the same with |dS| bounded by P (|dO|.|v| + |dO|.|O|): every
                              # product any fp32 sum forming the entry adds
    delta: torch.Tensor       # the part through Delta = dO . O: P |dO|.|O| times |k| or |q|


def term_magnitudes(q, k, v, out, dout, p, case: AttentionCase, dp=None, delta=None) -> dict[str, Terms]:
    """Per gradient entry, in p's dtype:

        dV_j = sum_i P_ij dO_i                      actual = magnitude = sum_i P_ij |dO_i|
        dS_ij = P_ij (dO_i . v_j - dO_i . O_i)
        dQ_i = scale sum_j dS_ij k_j                actual = |scale| sum_j |dS_ij| |k_j|
        dK_j = scale sum_i dS_ij q_i                actual = |scale| sum_i |dS_ij| |q_i|

    magnitude replaces |dS_ij| by P_ij (|dO_i|.|v_j| + |dO_i|.|O_i|), the products the fp32 dot
    products forming dP and Delta add; delta keeps only P_ij |dO_i|.|O_i|. GQA: dK, dV summed
    over the group. Rounding an operand (P, dS, O) moves an entry by about u of `actual` (of
    `delta` for O); summing in another order by up to n u32 of `magnitude`, which can far exceed
    the entry itself, since its terms cancel (sum_j dS_ij = 0 for every row). `dp` (dO V^T) and
    `delta` (rowsum(dO * O)): already computed by the caller, in p's dtype."""
    dt = p.dtype
    q, k, v, out, dout = (t.to(dt) for t in (q, k, v, out, dout))
    k, v = _expand(k, case.heads), _expand(v, case.heads)
    if dp is None:
        dp = dout @ v.transpose(-1, -2)
    if delta is None:
        delta = (dout * out).sum(dim=-1, keepdim=True)
    delta_abs = (dout * out).abs().sum(dim=-1, keepdim=True)
    # Products in place on fresh temporaries, factors in the order written (x * p == p * x).
    ds = (dp - delta).abs_().mul_(p)
    ds_mag = (dout.abs() @ v.abs().transpose(-1, -2)).add_(delta_abs).mul_(p)
    ds_delta = p * delta_abs
    scale = abs(case.softmax_scale)
    ka, qa = k.abs(), q.abs()
    dv = _group_sum(p.transpose(-1, -2) @ dout.abs(), case.kv_heads)
    return {"dq": Terms(*((x @ ka).mul_(scale) for x in (ds, ds_mag, ds_delta))),
            "dk": Terms(*(_group_sum((x.transpose(-1, -2) @ qa).mul_(scale), case.kv_heads)
                          for x in (ds, ds_mag, ds_delta))),
            "dv": Terms(dv, dv, torch.zeros_like(dv))}


def oracle_gradients(q, k, v, dout, case: AttentionCase, *, deferred: bool = False,
                     forward: Reference | None = None) -> GradReference:
    """float64 gradients of the forward oracle on the rounded inputs (module docstring): the
    ground truth. `deferred` as in oracle.oracle (the score magnitude left a 0-d tensor).
    `forward`: oracle.oracle of these same q, k, v, when the caller has it (the forward's
    judgement): its out, lse and score magnitude are what would be computed here again."""
    with judging():                    # explicit float64 arithmetic: no autograd anywhere
        q64, k64, v64, dout64 = (t.detach().to(torch.float64) for t in (q, k, v, dout))
        # The score magnitude is the gradient rule's; the output's is only the forward's.
        ref = forward or _attend(q64, k64, v64, case, torch.float64, None, deferred=deferred,
                                 out_magnitude=False)
        mask = _mask(case, q.device)
        p, slope = _probabilities(q64, k64, case, ref.lse, mask)
        ke, ve = _expand(k64, case.heads), _expand(v64, case.heads)
        dp = dout64 @ ve.transpose(-1, -2)
        delta = (dout64 * ref.out).sum(dim=-1, keepdim=True)
        ds = (dp - delta).mul_(p)
        if slope is not None:          # through the softcap: d(c tanh(x/c))/dx
            ds.mul_(slope)
        scale = case.softmax_scale
        grads = {"dq": (ds @ ke).mul_(scale),
                 "dk": _group_sum((ds.transpose(-1, -2) @ q64).mul_(scale), case.kv_heads),
                 "dv": _group_sum(p.transpose(-1, -2) @ dout64, case.kv_heads)}
        terms = term_magnitudes(q64, k64, v64, ref.out, dout64, p, case, dp=dp, delta=delta)
        return GradReference(grads, ~mask.any(dim=-1), ~mask.any(dim=0), ref.score_magnitude,
                             terms)


def same_precision_gradients(q, k, v, dout, case: AttentionCase, fp32_matmul: str = "ieee", *,
                             forward: Reference | None = None) -> GradReference:
    """FlashAttention-2's backward at the input precision (module docstring). `forward`: the
    same-precision reference of these q, k, v (magnitudes=False), when the caller has it."""
    in_dtype = q.dtype
    # Its out and lse only: the magnitudes the tolerance reads are the oracle's.
    fwd = forward or same_precision_reference(q, k, v, case, fp32_matmul, magnitudes=False)
    operand = truncate_to_tf32 if reads_tf32(in_dtype, fp32_matmul) else (lambda t: t)

    def rounded(t):          # a matmul operand in the input dtype (TF32 for TF32 fp32 matmuls)
        return operand(t.to(in_dtype).to(torch.float32))

    qf, kf, vf, do = (operand(t.to(torch.float32)) for t in (q, k, v, dout))
    ke, ve = _expand(kf, case.heads), _expand(vf, case.heads)
    mask = _mask(case, q.device)
    p, slope = _probabilities(qf, kf, case, fwd.lse, mask)
    delta = (dout.to(torch.float32) * fwd.out.to(torch.float32)).sum(dim=-1, keepdim=True)
    ds = p * (do @ ve.transpose(-1, -2) - delta)
    if slope is not None:
        ds = ds * slope
    scale = case.softmax_scale
    grads = {"dq": (scale * (rounded(ds) @ ke)).to(in_dtype),
             "dk": _group_sum(scale * (rounded(ds).transpose(-1, -2) @ qf), case.kv_heads).to(in_dtype),
             "dv": _group_sum(rounded(p).transpose(-1, -2) @ do, case.kv_heads).to(in_dtype)}
    return GradReference(grads, ~mask.any(dim=-1), ~mask.any(dim=0), fwd.score_magnitude)
