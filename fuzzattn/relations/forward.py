"""Metamorphic relations: identities between two runs of one implementation, no oracle needed.

Each relation takes the case's inputs (`materialize`: the case's layout, in NaN-guarded storage),
derives transformed inputs from them exactly, runs the implementation on both, and checks the
identity attention must satisfy. No float64 attention is computed and no Nq x Nk matrix is formed
outside the kernel, so relations also run at lengths too large for the oracle
(`Profile.metamorphic_seq`). Transformed inputs are written into a second materialisation of
the case, so both runs see the case's layout in NaN-guarded storage (batch_independence passes
slices, views of that layout): a layout-dependent code path then rounds both runs alike, which
value_shift and causal_prefix rely on (CPU matmuls round a strided q differently from a copy).

    relation(impl, case, device) -> Verdict | None      (None: the relation does not apply)

Verdicts are named "metamorphic:<relation>". They are not engine checks (not in verdict.CHECKS)
and belong in no judge.Report: callers collect them as a plain list (`check_relations`). A crash
in either run fails the relation; NaN in either output fails it too (the identities are between
finite numbers, and a correct kernel gives finite outputs for finite inputs).

Every tolerance is built from one rounding model (`fuzzattn.relations.rounding`); each relation
says which of its terms can differ between its two runs.

The relations:
  key_permutation     non-causal: permuting keys and values together leaves the output unchanged.
  batch_independence  each batch element computed alone equals its slice of the batched result.
  value_shift         V + c (c a constant row) gives O + c on rows that see a key; lse unchanged.
  score_shift         k_j + w for every key adds scale * q_i.w to every score of row i: the output
                      is unchanged and lse moves by exactly that amount.
  causal_prefix       causal: replacing keys and values from a cut t on leaves every row whose last
                      visible key is before t unchanged, exactly.
  sequence_isolation  packed: replacing the other sequences' keys and values leaves a sequence's
                      rows unchanged, exactly: a leak named where it happens, with no oracle.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.dtypes import BY_NAME, U32
from fuzzattn.contract.implementation import Implementation
from fuzzattn.contract.varlen import spans
from fuzzattn.inputs.materialize import materialize
from fuzzattn.judgement.judge import default_device
from fuzzattn.relations.two_runs import (all_rows, as_relation, case_generator, relation_verdict,
                                           row_errors, rows_with_keys, run_once)
from fuzzattn.relations.rounding import Rounding, finite_abs, max_abs_v, row_abs
from fuzzattn.judging.verdict import Verdict

SHIFT_MIN = 8.0                  # score_shift: smallest added key component (a power of two)
REPLACEMENT_SCALE = 16.0         # causal_prefix: replaced keys/values are 16 * N(0, 1)


def _lse_part(lse, expected, allowed, checked):
    return ("lse", row_errors(lse, expected), allowed, checked)


def _out_allowed(r: Rounding, eps: tuple, v_max, outs) -> torch.Tensor:
    """Two runs that may differ in every rounding: each run's whole error, each output rounded."""
    return (r.rerun(eps[0], v_max) + r.rerun(eps[1], v_max)
            + r.u_out * (row_abs(outs[0]) + row_abs(outs[1])))


def _lse_allowed(r: Rounding, eps: tuple, lses) -> torch.Tensor:
    return (eps[0] + eps[1] + 2 * r.reduction
            + U32 * (finite_abs(lses[0]) + finite_abs(lses[1])))


def _compare_runs(name, impl, case, r, eps, v_max, out, lse, out2, lse2, note="") -> Verdict:
    """Verdict for two runs that must agree up to the rounding of two independent runs."""
    rows = all_rows(out)
    parts = [("out", row_errors(out2, out), _out_allowed(r, eps, v_max, (out, out2)), rows)]
    if lse is not None and lse2 is not None:
        parts.append(_lse_part(lse2, lse, _lse_allowed(r, eps, (lse, lse2)), rows))
    return relation_verdict(name, impl, case, parts, note=note)


def _overwrite(view: torch.Tensor, values: torch.Tensor) -> None:
    """Write `values` (the view's logical shape) into `view` in place, also where `view`
    broadcasts with stride 0: index 0 of a broadcast dimension is written, and every index sees
    it, so the transformed tensor stays a broadcast (values differing along it are dropped)."""
    index = tuple(slice(0, 1) if stride == 0 and size > 1 else slice(None)
                  for size, stride in zip(view.shape, view.stride()))
    view[index].copy_(values[index])


def _transformed(case: AttentionCase, device, **tensors: torch.Tensor):
    """A second materialisation of the case with some of q, k, v overwritten in place."""
    inputs = materialize(case, device)
    for name, values in tensors.items():
        _overwrite(getattr(inputs, name), values)
    return inputs


# -- 1. key permutation -----------------------------------------------------------------------
@as_relation("key_permutation")
def key_permutation(impl, case, device):
    """Non-causal attention is a sum over keys: permuting k and v rows together (one permutation
    from torch.Generator(case.data_seed), never the identity) changes only how that sum is formed.

    Tolerance: every term of the model, for both runs. The pairs (q_i, k_j) are the same, but a
    key's position decides its tile, the running max it is shifted by, how its weight is
    rounded and where it enters the sums. Out: sum over runs of min(e^2eps - 1, 1) 2 max|V|
    + (u_p + u_mm + Nk eta + (Nk + 8) u32) max|V|, plus u_out (|O| + |O'|).
    lse: 2 eps + 2 (Nk + 8) u32 + u32 (|lse| + |lse'|).
    """
    if case.is_causal or case.seq_k < 2 or case.seq_q == 0:
        return None
    inputs = materialize(case, device)
    perm = torch.randperm(case.seq_k, generator=case_generator(case))
    if bool((perm == torch.arange(case.seq_k)).all()):
        perm = perm.roll(1)
    perm = perm.to(device)
    permuted = _transformed(case, device, k=inputs.k[:, :, perm], v=inputs.v[:, :, perm])
    out, lse = run_once(impl, *inputs.tensors(), case, "original")
    out2, lse2 = run_once(impl, *permuted.tensors(), case, "permuted")

    r = Rounding(impl, case)
    eps = r.score_error(inputs.q, inputs.k, case.group_size)
    note = "bitwise identical" if torch.equal(out, out2) else ""
    return _compare_runs("key_permutation", impl, case, r, (eps, eps),
                         max_abs_v(inputs.v, case.group_size), out, lse, out2, lse2, note)


# -- 2. batch independence --------------------------------------------------------------------
@as_relation("batch_independence")
def batch_independence(impl, case, device):
    """Batch elements do not interact: element b computed alone (q, k, v sliced b:b+1, views of
    the case's layout) equals element b of the batched run.

    Not asserted bitwise, though often it is (the detail says which): a kernel may legitimately
    schedule differently for another batch size (FlashAttention's split-KV count depends on
    batch * heads; CPU GEMMs block by shape), which changes roundings and nothing else. Tolerance:
    key_permutation's, every term for both runs.
    """
    if case.batch < 2 or case.seq_q == 0:
        return None
    inputs = materialize(case, device)
    out, lse = run_once(impl, *inputs.tensors(), case, "batched")
    alone = case.replace(batch=1)
    runs = [run_once(impl, *(t[b:b + 1] for t in inputs.tensors()), alone, f"batch element {b}")
            for b in range(case.batch)]
    out2 = torch.cat([o for o, _ in runs])
    lse2 = None if any(l is None for _, l in runs) else torch.cat([l for _, l in runs])

    r = Rounding(impl, case)
    eps = r.score_error(inputs.q, inputs.k, case.group_size)
    bitwise = torch.equal(out, out2) and (lse is None or lse2 is None or torch.equal(lse, lse2))
    return _compare_runs("batch_independence", impl, case, r, (eps, eps),
                         max_abs_v(inputs.v, case.group_size), out, lse, out2, lse2,
                         "bitwise identical" if bitwise else "not bitwise identical")


# -- 3. value shift ---------------------------------------------------------------------------
def _shift_row(case: AttentionCase) -> torch.Tensor:
    """(D,) float64: c_d = +-2^e, e in -1..2, from the case's seed. Powers of two are exact in
    every dtype, so O + c is exact in float64 and only the rounding of V + c is inexact."""
    g = case_generator(case)
    exponents = torch.randint(-1, 3, (case.head_dim,), generator=g).to(torch.float64)
    signs = torch.randint(0, 2, (case.head_dim,), generator=g).to(torch.float64) * 2 - 1
    return signs * torch.exp2(exponents)


@as_relation("value_shift")
def value_shift(impl, case, device):
    """Attention weights sum to one, so the output is affine in V: V' = round(V + c), c a constant
    row (+-0.5 .. +-4 per column), gives O + c on rows that see a key (the others stay 0).

    Exactness: V' is V + c rounded once to the dtype; that rounding d = V' - V - c is measured
    exactly in float64. q and k are the same tensors at the same positions, so (deterministic
    kernel) scores, the rounded weights p~ and their fp32 sum l are identical in both runs, and
    exactly O' - O = c sum_j p~_j / l + sum_j p~_j d_j / l. Hence |O' - (O + c)| <=
        (1 + u_p) max|d|                         the rounded shift
      + (u_p + (Nk + 8) u32) max|c|               sum p~ / l is not exactly 1
      + (u_mm + Nk eta + (Nk + 8) u32) (max|V| + max|V'|)   operand rounding and sums, both runs
      + u_out (|O| + |O'|)                       each output rounded once
    lse depends on q and k only: it must be unchanged, exactly. A kernel declaring
    deterministic=False may round its scores differently per run: both runs' whole error is
    added to both tolerances.
    """
    if case.seq_q == 0:
        return None
    inputs = materialize(case, device)
    c = _shift_row(case).to(device)
    v64 = inputs.v.to(torch.float64)
    shifted = _transformed(case, device, v=(v64 + c).to(inputs.v.dtype))
    v2 = shifted.v
    d = v2.to(torch.float64) - v64 - c
    out, lse = run_once(impl, *inputs.tensors(), case, "original")
    out2, lse2 = run_once(impl, *shifted.tensors(), case, "shifted")

    r = Rounding(impl, case)
    group = case.group_size
    v_max, v2_max, d_max = max_abs_v(inputs.v, group), max_abs_v(v2, group), max_abs_v(d, group)
    c_max = float(c.abs().max())
    allowed = ((1 + r.u_p) * d_max + (r.u_p + r.reduction) * c_max
               + (r.u_mm + r.nk * r.eta + r.reduction) * (v_max + v2_max)
               + r.u_out * (row_abs(out) + row_abs(out2)))
    lse_allowed = torch.zeros((), dtype=torch.float64, device=device)
    if not impl.caps.deterministic:
        eps = r.score_error(inputs.q, inputs.k, group)
        allowed = allowed + 2 * r.rerun(eps, torch.maximum(v_max, v2_max))
        lse_allowed = lse_allowed + 2 * eps + 2 * r.reduction
    seen = rows_with_keys(case, device)
    expected = out.to(torch.float64) + c * seen[:, None].to(torch.float64)
    rows = all_rows(out)
    parts = [("out", row_errors(out2, expected), allowed, rows)]
    if lse is not None and lse2 is not None:
        parts.append(_lse_part(lse2, lse, lse_allowed, rows))
    return relation_verdict("value_shift", impl, case, parts)


# -- 4. score shift ---------------------------------------------------------------------------
def _grid(magnitude: float, bits: int) -> float:
    """Smallest power of two g such that every multiple of g up to `magnitude` in absolute value
    is exact with `bits` significant bits (magnitude <= 2^bits * g)."""
    return 2.0 ** math.ceil(math.log2(max(magnitude, 2.0 ** -100) / 2.0 ** bits))


@as_relation("score_shift")
def score_shift(impl, case, device):
    """Adding the same vector w to every key adds scale * q_i.w to every score of row i, the same
    for all its keys: the softmax, hence the output, is unchanged, and lse moves by scale * q_i.w.

    Construction, exact in the dtype: w = t e_d0, one coordinate d0 from the case's seed, t a power
    of two >= 8. Column d0 of k is first snapped to multiples of a power of two g <= t chosen so
    that every multiple of g up to max|k_d0| + t is representable; then the snapped k (written
    back into the case's layout, the baseline) and k + w are both exact. The expected lse shift
    sigma_i = scale * q_i,d0 * t is exact in float64.
    Tolerance: the two runs' scores are different dot products, so every term of the model
    enters for both runs, with eps from k and from k + w. lse: eps + eps' + 2 (Nk + 8) u32
    + u32 (|lse| + |lse'| + |sigma|), the last for the kernel's fp32 copy of the scale.
    """
    if case.seq_q == 0 or case.seq_k == 0:
        return None
    inputs = materialize(case, device)
    d0 = int(torch.randint(case.head_dim, (1,), generator=case_generator(case)))
    bits = BY_NAME[case.dtype].precision_bits
    column = inputs.k[..., d0].to(torch.float64)
    k_max = float(column.abs().max())
    t = SHIFT_MIN
    while _grid(k_max + t, bits) > t:
        t *= 2
    grid = _grid(k_max + t, bits)
    snapped = inputs.k.to(torch.float64)
    snapped[..., d0] = torch.round(column / grid) * grid
    _overwrite(inputs.k, snapped.to(inputs.k.dtype))
    snapped[..., d0] += t
    shifted = _transformed(case, device, k=snapped.to(inputs.k.dtype))
    k2 = shifted.k
    added = k2.to(torch.float64) - inputs.k.to(torch.float64)
    column_added = added[..., d0]
    if not (bool((column_added == t).all()) and int(added.count_nonzero()) == column_added.numel()):
        raise AssertionError(f"score_shift: k and k + {t:g} e_{d0} are not both exact "
                             f"in {case.dtype}")
    out, lse = run_once(impl, *inputs.tensors(), case, "original")
    out2, lse2 = run_once(impl, *shifted.tensors(), case, "shifted")

    r = Rounding(impl, case)
    group = case.group_size
    eps = (r.score_error(inputs.q, inputs.k, group), r.score_error(inputs.q, k2, group))
    rows = all_rows(out)
    parts = [("out", row_errors(out2, out), _out_allowed(r, eps, max_abs_v(inputs.v, group),
                                                          (out, out2)), rows)]
    if lse is not None and lse2 is not None:
        sigma = case.softmax_scale * inputs.q[..., d0].to(torch.float64) * t
        expected = lse.to(torch.float64) + sigma     # -inf + sigma stays -inf for empty rows
        allowed = _lse_allowed(r, eps, (lse, lse2)) + U32 * finite_abs(sigma)
        parts.append(_lse_part(lse2, expected, allowed, rows))
    return relation_verdict("score_shift", impl, case, parts, note=f"w = {t:g} e_{d0}")


# -- 5. causal prefix -------------------------------------------------------------------------
@as_relation("causal_prefix")
def causal_prefix(impl, case, device):
    """Causal row i reads no key after its last visible one: replace k and v rows >= t (a cut from
    the case's seed) with 16 * N(0, 1) values, and every row whose last visible key is < t
    (top_left: i < t; bottom_right: i + Nk - Nq < t; rows that see no key included) must be
    unchanged.

    Replacements are large and finite, never NaN: a correct kernel may load masked keys and form
    exp(-inf) * v = 0 * v, which is NaN for v = NaN. They are large so that a leaked key moves the
    output visibly (and an additive mask sentinel smaller than their scores lets them through).
    Tolerance: none (for deterministic kernels). Every quantity entering a checked row is
    bit-identical in both runs (same q, same visible keys at the same positions), and a masked key
    contributes exact zeros (exp(-inf) = 0, 0 * v = 0, x + 0 = x), so out and lse must be equal
    as values (+0 and -0 compare equal). deterministic=False kernels get both runs' whole error.
    """
    if not case.is_causal or case.seq_k < 2 or case.seq_q == 0:
        return None
    offset = 0 if case.causal == "top_left" else case.seq_k - case.seq_q
    # t must leave a key to replace (t <= Nk - 1) and a row with a visible key to check (row 0's
    # last visible key is `offset`, so t > offset).
    low = max(1, offset + 1)
    if low > case.seq_k - 1:
        return None
    g = case_generator(case)
    t = int(torch.randint(low, case.seq_k, (1,), generator=g))
    inputs = materialize(case, device)
    replaced = {}
    for name in "kv":
        tensor = getattr(inputs, name).clone()
        fresh = REPLACEMENT_SCALE * torch.randn(tensor[:, :, t:].shape, generator=g)
        tensor[:, :, t:] = fresh.to(tensor.dtype).to(device)
        replaced[name] = tensor
    replaced = _transformed(case, device, **replaced)
    out, lse = run_once(impl, *inputs.tensors(), case, "original")
    out2, lse2 = run_once(impl, *replaced.tensors(), case, "replaced")

    last_checked = min(t - offset, case.seq_q) - 1
    checked = (torch.arange(case.seq_q, device=device) <= last_checked).expand(out.shape[:3])
    parts = _unchanged_rows(impl, case, inputs, (out, lse), (out2, lse2), checked, device)
    return relation_verdict("causal_prefix", impl, case, parts,
                    note=f"keys >= {t} replaced; rows 0-{last_checked} checked")


def _unchanged_rows(impl, case, inputs, first, second, checked, device) -> list:
    """The verdict parts of two runs whose `checked` rows must agree: exactly for deterministic
    kernels, within both runs' rounding error (the original keys' scores) otherwise."""
    (out, lse), (out2, lse2) = first, second
    allowed = lse_allowed = torch.zeros((), dtype=torch.float64, device=device)
    if not impl.caps.deterministic:
        r = Rounding(impl, case)
        eps = r.score_error(inputs.q, inputs.k, case.group_size)   # the checked rows' keys
        allowed = _out_allowed(r, (eps, eps), max_abs_v(inputs.v, case.group_size), (out, out2))
        if lse is not None and lse2 is not None:
            lse_allowed = _lse_allowed(r, (eps, eps), (lse, lse2))
    parts = [("out", row_errors(out2, out), allowed, checked)]
    if lse is not None and lse2 is not None:
        parts.append(_lse_part(lse2, lse, lse_allowed, checked))
    return parts


# -- 6. sequence isolation ------------------------------------------------------------------
@as_relation("sequence_isolation")
def sequence_isolation(impl, case, device):
    """Replace the keys and values of every sequence but one (chosen from the case's seed among
    those with queries, when another holds keys) with 16 * N(0, 1) values: that sequence's rows
    of out and lse must be unchanged, exactly. Never NaN: a correct kernel may load a
    neighbour's keys and weight them 0 * v.
    Tolerance: none for deterministic kernels (every quantity entering a checked row is the same
    in both runs, and a key it does not see contributes exact zeros); deterministic=False kernels
    get both runs' whole error, as causal_prefix gives them."""
    if not case.varlen:
        return None
    eligible = [s for s in spans(case) if s[1] > s[0] and s[3] - s[2] < case.seq_k]
    if not eligible:
        return None
    g = case_generator(case)
    q0, q1, k0, k1 = eligible[int(torch.randint(len(eligible), (1,), generator=g))]
    inputs = materialize(case, device)
    replaced = {}
    for name in "kv":
        tensor = getattr(inputs, name).clone()
        fresh = (REPLACEMENT_SCALE * torch.randn(tensor.shape, generator=g)).to(tensor.dtype)
        fresh[:, :, k0:k1] = tensor[:, :, k0:k1].cpu()
        replaced[name] = fresh.to(device)
    replaced = _transformed(case, device, **replaced)
    out, lse = run_once(impl, *inputs.tensors(), case, "original")
    out2, lse2 = run_once(impl, *replaced.tensors(), case, "others replaced")
    rows = torch.arange(case.seq_q, device=device)
    checked = ((rows >= q0) & (rows < q1)).expand(out.shape[:3])
    parts = _unchanged_rows(impl, case, inputs, (out, lse), (out2, lse2), checked, device)
    return relation_verdict("sequence_isolation", impl, case, parts,
                            note=f"keys outside {k0}-{k1 - 1} replaced; rows {q0}-{q1 - 1} checked")


RELATIONS: dict[str, Callable[..., Verdict | None]] = {
    "key_permutation": key_permutation,
    "batch_independence": batch_independence,
    "value_shift": value_shift,
    "score_shift": score_shift,
    "causal_prefix": causal_prefix,
    "sequence_isolation": sequence_isolation,      # packed cases only
}


def check_relations(impl: Implementation, case: AttentionCase, device=None) -> list[Verdict]:
    """The verdict of every relation that applies to this implementation and case."""
    device = device or default_device()
    verdicts = []
    for relation in RELATIONS.values():
        verdict = relation(impl, case, device)
        if verdict is not None:
            verdicts.append(verdict)
    return verdicts
