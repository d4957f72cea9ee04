"""Judge an implementation's gradients: dq, dk, dv against the float64 gradient oracle, plus the
checks value comparison cannot see, as for the forward.

For an implementation declaring `Capabilities.backward`, `judge()` calls `judge_gradients` after
every forward check passed. The upstream gradient dO comes from the case's data seed
(`inputs.materialize_dout`: deterministic, in q's layout, NaN-guarded). The gradients come from
the contract's one gradient call (`execute.call_gradients`): an explicit backward is handed the
forward's own out and lse from the judged forward run, copied into NaN-guarded storage (out in
q's layout), so it is judged on exactly what the forward gave; autograd runs the forward itself.

Runs, as for the forward:
1. the adversarial run: q, k, v, dO (and out, lse) inside NaN padding, torch.empty and freed
   blocks of the gradients' sizes NaN-filled; storages snapshotted to catch mutation;
2. the oracle's and the same-precision reference's gradients on fresh copies (gradients/reference_gradients.py);
3. NaN where the oracle is finite is attributed by re-running with clean memory, then also with
   zero padding (grad_unwritten, grad_out_of_bounds_read, else grad_nonfinite);
4. exact checks: dq = 0 on rows with no visible key, dk = dv = 0 on keys no row sees;
5. dq, dk, dv by the gradient rule (tolerance.grad_finish);
6. when `deterministic_backward` is declared, a second, plain run on the same inputs (and the
   same forward outputs) must give bitwise-identical gradients.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import torch

from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.implementation import Implementation
from fuzzattn.gradients.reference_gradients import NAMES, GradReference, oracle_gradients, same_precision_gradients
from fuzzattn.inputs.materialize import Inputs, as_bits, born_on_device, materialize, materialize_dout
from fuzzattn.judging.placement import judging, moved_together
from fuzzattn.inputs.transfer import same_device
from fuzzattn.judging.tolerance import (all_finite, differences, grad_allowance, grad_finish,
                                       maxima, with_reference)
from fuzzattn.judging.verdict import Verdict, heatmap, locate
from fuzzattn.gradients.backward_runs import GradRun, on_device, run_backward

ROW_KIND = {"dq": "query rows", "dk": "key rows", "dv": "key rows"}


def _overflows(g: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Elements where `g` is the exact gradient rounded to its dtype: an infinity of the exact
    value's sign where that value is past the dtype's largest finite number (it rounds to inf:
    fp16 dk of below_sentinel cases reaches 8e4, past 65504: docs/CALIBRATION.md#gradient-range)."""
    rounded = exact.to(g.dtype)
    return torch.isinf(rounded) & (g == rounded)


def _nonfinite(run: GradRun, ref: GradReference,
               vacuous=frozenset()) -> dict[str, torch.Tensor | None]:
    """Per gradient, rows with NaN/inf where the oracle's gradient rounded to the gradient's
    dtype is finite (an exact value too large for the dtype correctly rounds to inf); None where
    there are none for certain: gradients named in `vacuous` (the rule allows more than the
    dtype's range), and on the host a gradient one float64 sum finds finite
    (tolerance.all_finite: two operations instead of ten, as the forward's check asks)."""
    run = on_device(run, ref.grads["dq"].device)
    rows = {}
    for name, g in run.grads.items():
        if name in vacuous or all_finite(g):
            rows[name] = None
            continue
        rows[name] = (~torch.isfinite(g.to(torch.float64)) & ~_overflows(g, ref.grads[name])
                      & torch.isfinite(ref.grads[name])).any(dim=-1)
    return rows


def _any_rows(rows: torch.Tensor | None) -> bool:
    return rows is not None and bool(rows.any())


def _allowances(impl, case, run: GradRun, ref: GradReference) -> dict[str, float]:
    """Each gradient's noise term (tolerance.grad_allowance), at its own dtype and with the
    number of terms each of its elements sums (its fp32 accumulation length)."""
    summed = {"dq": case.seq_k, "dk": case.seq_q * case.group_size,
              "dv": case.seq_q * case.group_size}
    return {name: grad_allowance(g.dtype, ref.terms[name], fp32_matmul=impl.caps.fp32_matmul,
                                 score_magnitude=ref.score_magnitude, terms_summed=summed[name])
            for name, g in run.grads.items()}


def _vacuous(run: GradRun, allowances: dict[str, float]) -> frozenset[str]:
    """Gradients whose allowance is past their dtype's range: scores so large that fp32 cannot
    recompute P within it (docs/CALIBRATION.md#gradient-range: below_sentinel fp16, scores ~1e8,
    where SDPA's default backward and triton_fa2's return inf in dk or dv while the exact values
    are ~1e2-1e4). Nothing about such a gradient can be judged."""
    return frozenset(name for name, g in run.grads.items()
                     if allowances[name] >= torch.finfo(g.dtype).max)


def _attribute(impl, case, device, forward, ref: GradReference,
               vacuous=frozenset()) -> tuple[str, str]:
    def finite(run: GradRun) -> bool:
        return run.failure is None and not any(_any_rows(b) for b in
                                               _nonfinite(run, ref, vacuous).values())

    here = ref.grads["dq"].device
    if finite(run_backward(impl, case, device, forward, adversarial=True, poison=False, here=here)):
        return "grad_unwritten", "NaN appears only when the gradients' memory starts as NaN"
    if finite(run_backward(impl, case, device, forward, adversarial=True, poison=False, pad_value=0.0,
                   here=here)):
        return ("grad_out_of_bounds_read",
                "NaN appears only when the storage around q, k, v, dO (out, lse) holds NaN")
    return "grad_nonfinite", "NaN/inf with clean padding and clean gradient memory"


def _empty_rows(impl, case, run: GradRun, ref: GradReference) -> Verdict | None:
    """dq must be exactly 0 on rows with no visible key, dk and dv on keys no row sees."""
    where = []
    bad_rows = None
    for names, rows in ((("dq",), ref.empty_rows), (("dk", "dv"), ref.unseen_keys)):
        if not bool(rows.any()):
            continue
        for name in names:
            g = run.grads[name][:, :, rows]
            wrong = (g != 0).any(dim=-1)            # NaN != 0 as well
            if bool(wrong.any()):
                bad = torch.zeros(g.shape[:2] + (rows.numel(),), dtype=torch.bool, device=g.device)
                bad[:, :, rows] = wrong
                where.append(f"{name} at {locate(bad)} ({ROW_KIND[name]})")
                bad_rows = bad if bad_rows is None else bad_rows
    if not bool(ref.empty_rows.any()) and not bool(ref.unseen_keys.any()):
        return None
    return Verdict(impl=impl.name, case=case, check="grad_empty_rows", passed=not where,
                   where="; ".join(where), heatmap=heatmap(bad_rows) if where else "",
                   detail="rows with no visible key must get dq = 0, keys no row sees "
                          "dk = dv = 0" if where else "")


def _values(impl, case, run: GradRun, ref: GradReference, spr,
            allowances: dict[str, float], vacuous=frozenset(), finite=frozenset(), *,
            margins: bool = False) -> list[Verdict]:
    """dq, dk, dv by the gradient rule; `finite`: gradients known to hold no NaN or inf (those
    `_nonfinite` found finite on the host), which can hold no correctly rounded infinity.
    `spr`: the same-precision gradients, or a function computing them, asked for only when a
    gradient's error is above its noise (tolerance.py's tiers; `margins`: always). The maxima of
    all three are read together, and the reference's errors' in one more read if needed."""
    if margins and not isinstance(spr, GradReference):
        spr = spr()
    at_hand = isinstance(spr, GradReference)
    judged = {}           # name -> [differences, their maxima, whether it overflowed]
    for name in NAMES:
        if name in vacuous:
            continue
        got, exact = run.grads[name], ref.grads[name]
        overflow = None if name in finite else _overflows(got, exact)
        overflowed = overflow is not None and bool(overflow.any())
        if overflowed:
            # The correctly rounded infinities are right; judge them as exact (in float64).
            got = torch.where(overflow, exact, got.to(torch.float64))
        reference = _reference_for(spr.grads[name], exact, overflowed) if at_hand else None
        judged[name] = [differences(got, reference, exact), None, overflowed]
    read = iter(maxima(*(t for d, _, _ in judged.values() for t in d.maximised)))
    for entry in judged.values():
        entry[1] = [next(read) for _ in entry[0].maximised]
    bounds = {name: grad_finish(d, maximum, allowances[name], margins=margins)
              for name, (d, maximum, _) in judged.items()}
    undecided = [name for name, b in bounds.items() if b is None]
    if undecided:                # errors above their noise: the reference's errors, one read
        spr = spr()
        for name in undecided:
            d, maximum, overflowed = judged[name]
            d = with_reference(d, _reference_for(spr.grads[name], ref.grads[name], overflowed))
            judged[name] = [d, maximum, overflowed]
        more = iter(maxima(*(judged[name][0].ref_err for name in undecided)))
        for name in undecided:
            d, maximum, _ = judged[name]
            bounds[name] = grad_finish(d, maximum + [next(more)], allowances[name],
                                       margins=margins)
    verdicts = []
    for name, b in bounds.items():
        bad = None
        if not b.ok:
            bad = (b.row_errors > b.allowed) | torch.isnan(b.row_errors)
        verdicts.append(Verdict(
            impl=impl.name, case=case, check="grad_" + name, passed=b.ok, error=b.error,
            allowed=b.allowed, where=locate(bad) if not b.ok else "",
            heatmap=heatmap(bad) if not b.ok else "",
            detail="" if b.ok else f"{ROW_KIND[name]}; same-precision reference error "
                                   f"{b.reference_error:.3g}", ))
    return verdicts


def _reference_for(reference: torch.Tensor, exact: torch.Tensor, overflowed: bool) -> torch.Tensor:
    """The same-precision gradient as judged: where it holds a correctly rounded infinity of an
    exact value past its dtype's range (`overflowed`: the implementation's did), the exact value
    in float64, as the implementation's is."""
    if not overflowed:
        return reference
    return torch.where(_overflows(reference, exact), exact, reference.to(torch.float64))


def judge_gradients(impl: Implementation, case: AttentionCase, device, forward=None,
                    judge_on=None, pristine: Inputs | None = None,
                    references_on=None, forward_references=None,
                    margins: bool = False) -> list[Verdict]:
    """Every gradient check of `impl` on `case`. `forward` = (out, lse) of the judged forward
    run, handed (as copies) to an explicit backward; autograd implementations ignore it.
    `judge_on`: where the gradient oracle, the reference and the comparisons compute
    (judging/placement.py; default: `device`). `pristine`: the forward judgement's inputs, which no
    implementation run was handed: the runs copy them and the oracles read them, instead of
    materialising the case again (the largest cases spend ~100 ms in the CPU's randn).
    `references_on`: where the gradient oracle and the reference compute, when not `judge_on`:
    they are read back to it in one copy (judging/placement.py). `forward_references`: the forward
    judgement's (oracle, same-precision reference) of `pristine`, there: the gradient references
    build on them instead of computing the two forwards again (the same bits: the same functions
    of the same inputs); the same-precision one may be a function computing it (judge.py).
    `margins` as in judge.judge: judged on the host, the same-precision gradients are computed
    only if a gradient's error is above its noise alone, unless `margins`."""
    forward = tuple(t.detach() if t is not None else None for t in forward) \
        if impl.backward_fn is not None and forward is not None else None
    here = torch.device(judge_on if judge_on is not None else device)
    # Where the gradient oracle and the reference compute.
    references = torch.device(references_on) if references_on is not None else here
    source = _source(case, device, pristine)
    first = run_backward(impl, case, device, forward, adversarial=True, here=here, source=source,
                         dout_for=references)
    if first.failure is not None:
        return [first.failure]
    verdicts = list(first.side_effects)
    first = on_device(first, here)
    # The forward references are the pristine inputs' (never a fresh materialisation's).
    known = forward_references if pristine is not None else None
    ref, spr = _references(impl, case, *_oracle_inputs(case, first, pristine, references),
                           known, references, here, margins)
    with judging():
        allowances = _allowances(impl, case, first, ref)
        vacuous = _vacuous(first, allowances)
        nonfinite = _nonfinite(first, ref, vacuous)
    verdicts += _nonfinite_verdict(impl, case, device, forward, ref, vacuous, nonfinite)
    with judging():
        empty = _empty_rows(impl, case, first, ref)
        if empty is not None:
            verdicts.append(empty)
        # A gradient with no rows to look at and not vacuous is one the host found finite.
        finite = frozenset(name for name, rows in nonfinite.items()
                           if rows is None and name not in vacuous)
        verdicts += _values(impl, case, first, ref, spr, allowances, vacuous, finite,
                            margins=margins)
    if impl.caps.deterministic_backward:
        verdicts += _rerun(impl, case, device, forward, here, source, first)
    return verdicts


def _source(case: AttentionCase, device, pristine: Inputs | None) -> Inputs | None:
    """What the runs copy their inputs from: the pristine inputs where they were made, on the
    device for a counter case, else on the host (a GPU case's CPU storages, moved with dO in one
    transfer); None without them (the runs materialise the case)."""
    if pristine is None:
        return None
    made_there = pristine.q.device.type == "cpu" or born_on_device(case, device)
    return pristine if made_there else pristine.host


def _oracle_inputs(case: AttentionCase, first: GradRun, pristine: Inputs | None,
                   references: torch.device) -> tuple[Inputs, torch.Tensor]:
    """The oracle's q, k, v and dO on `references`: the pristine inputs, else the first run's
    host copy when judging on the host (never handed to the implementation), else materialised
    again; dO as the first run read it back there, else materialised."""
    if pristine is not None:
        fresh = pristine.on(references)
    else:
        host = first.inputs.host
        fresh = host if host is not None and references.type == "cpu" \
            else materialize(case, references)
    if first.dout_here is not None:         # read back to `references` with the gradients
        dout = first.dout_here
    else:
        _, dout = materialize_dout(case, references)
    return fresh, dout


def _references(impl: Implementation, case: AttentionCase, fresh: Inputs, dout: torch.Tensor,
                known, references: torch.device, here: torch.device,
                margins: bool) -> tuple[GradReference, GradReference | Callable]:
    """The oracle's gradients and the same-precision ones (or a function computing them), on
    `here`; `known`: the forward's (oracle, same-precision) references to build on, or None."""
    away = not same_device(references, here)
    known_ref, known_spr = known if known is not None else (None, None)
    ref = oracle_gradients(*fresh.tensors(), dout, case, deferred=away, forward=known_ref)
    # What needs no autograd (the explicit same-precision backward, the allowances, the
    # comparisons) runs as the forward's references and checks do (placement.judging); the
    # implementation's runs, the oracle's autograd and the attribution's re-runs do not.
    def same_precision() -> GradReference:
        forward = known_spr() if callable(known_spr) else known_spr
        return same_precision_gradients(*fresh.tensors(), dout, case, impl.caps.fp32_matmul,
                                        forward=forward)

    with judging():
        # On the host, asked for by _values only when a gradient's error is above its noise
        # (tolerance.py's tiers); with a device involved, computed now and read back with the
        # oracle's gradients, so that asking later is no second wait.
        on_demand = here.type == "cpu" and not away and not margins
        spr = functools.cache(same_precision) if on_demand else same_precision()
        if away:
            ref, spr = moved_together([ref, spr], here)
    return ref, spr


def _nonfinite_verdict(impl, case, device, forward, ref: GradReference, vacuous,
                       nonfinite: dict[str, torch.Tensor | None]) -> list[Verdict]:
    """One verdict naming the source of NaN/inf where the oracle is finite (by the re-runs of
    `_attribute`), at the first gradient holding it; none when no gradient does."""
    broken = [name for name, rows in nonfinite.items() if _any_rows(rows)]
    if not broken:
        return []
    check, detail = _attribute(impl, case, device, forward, ref, vacuous)
    rows = nonfinite[broken[0]]
    return [Verdict(impl=impl.name, case=case, check=check, passed=False,
                    where=f"{broken[0]} at {locate(rows)} ({ROW_KIND[broken[0]]})",
                    heatmap=heatmap(rows), detail=f"{', '.join(broken)}: {detail}")]


def _rerun(impl, case, device, forward, here: torch.device, source: Inputs | None,
           first: GradRun) -> list[Verdict]:
    """A second, plain run on the same inputs, whose gradients must be bitwise the first's."""
    second = run_backward(impl, case, device, forward, adversarial=False, here=here,
                          source=source, side_effects=False)
    if second.failure is not None:
        return [dataclasses.replace(second.failure,
                                    detail="second run: " + second.failure.detail)]
    second = on_device(second, here)
    differs = [name for name in NAMES
               if not torch.equal(as_bits(first.grads[name]), as_bits(second.grads[name]))]
    return [Verdict(impl=impl.name, case=case, check="grad_nondeterministic",
                    passed=not differs,
                    detail=f"{', '.join(differs)} differ bitwise between two backward "
                           "runs on the same inputs" if differs else "")]
