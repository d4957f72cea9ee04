"""The value checks of one run against the references: rows with no visible key, the max rule for
out and lse, out_rms, and the rows holding NaN or inf where the oracle is finite (named by
re-running with clean memory). The rules themselves, and their constants: judging/tolerance.py
and judging/error_statistics.py; where the checks compute: judging/placement.py.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch

from fuzzattn.contract.dtypes import torch_dtype
from fuzzattn.run import runs
from fuzzattn.judging.error_statistics import out_rms_bound
from fuzzattn.judging.placement import moved
from fuzzattn.judging.oracle import Reference
from fuzzattn.judging.tolerance import (all_finite, differences, lse_finish, maxima, out_finish,
                                       summed_for_tf32, with_reference)
from fuzzattn.inputs.transfer import same_device
from fuzzattn.judging.verdict import Verdict, heatmap, locate


def run_on(run: runs.Run, device: torch.device) -> runs.Run:
    """`run` with its out and lse on `device`, where the judgement computes (placement.py)."""
    if run.out is None or same_device(run.out.device, device):
        return run
    if run.delivered is not None and same_device(run.delivered[0], device):
        out, lse = run.delivered[1:]
    else:
        out, lse = moved(run.out, device), moved(run.lse, device)
    return dataclasses.replace(run, call=dataclasses.replace(run.call, out=out, lse=lse))


def nonfinite_rows(run: runs.Run, ref: Reference) -> torch.Tensor | None:
    """(B, H, Nq) bool: rows with NaN/inf in out (or lse) where the oracle is finite; None when
    there can be none. On the host that is asked first, of one float64 sum per tensor
    (tolerance.all_finite: a float64 sum of float32 or narrower values cannot overflow), two
    operations instead of ten when there are none. Asked by value_verdicts only once the max
    rules' maxima showed a non-finite entry, and by the attribution's re-runs."""
    run = run_on(run, ref.out.device)
    if all(t is None or all_finite(t) for t in (run.out, run.lse)):
        return None
    bad = (~torch.isfinite(run.out) & torch.isfinite(ref.out)).any(dim=-1)
    if run.lse is not None:
        bad |= torch.isnan(run.lse) | (torch.isinf(run.lse) & torch.isfinite(ref.lse))
    return bad


def attribute_nonfinite(impl, case, device, ref: Reference) -> tuple[str, str]:
    """Re-run with clean output memory, then also with zero padding, to name the NaN's source.
    Both re-runs zero every tensor the kernel allocates (and hand the allocator zeroed blocks,
    or zeroed buffers) where the first run had NaN ones, so NaN left in freed memory by earlier
    runs cannot masquerade as a kernel's read."""
    def finite(run: runs.Run) -> bool:
        if run.failure is not None or not run.call.answered:
            return False
        rows = nonfinite_rows(run, ref)
        return rows is None or not bool(rows.any())

    here = ref.out.device
    if finite(runs.run(impl, case, device, adversarial=True, poison=False, here=here)):
        return "unwritten_output", "NaN appears only when the output memory starts as NaN"
    if finite(runs.run(impl, case, device, adversarial=True, poison=False, pad_value=0.0,
                       here=here)):
        return "out_of_bounds_read", "NaN appears only when the storage around the inputs holds NaN"
    return "nonfinite", "NaN/inf with clean padding and clean output memory"


def value_verdicts(impl, case, run: runs.Run, ref: Reference, spr, *,
                   check_out="out", check_lse="lse", check_stat="out_rms",
                   find_nonfinite: bool = True,
                   margins: bool = False) -> tuple[list[Verdict], torch.Tensor | None]:
    """The value checks of one run (empty rows, the max rule for out and lse, out_rms), and
    (`find_nonfinite`) the rows holding NaN/inf where the oracle is finite (nonfinite_rows),
    None when there are none.

    `spr`: the same-precision reference, or a function computing it (judge.py: on the host),
    called only when an error is above its noise alone (tolerance.py's tiers; `margins`: every
    bound decided on the whole rule, the reference always asked for).

    Every scalar the max rules need is read in one transfer (tolerance.maxima): both bounds'
    maxima (their reference errors' too, when the reference is at hand), the oracle's score
    magnitude while it is a 0-d tensor (computed on the accelerator the checks run on) and the
    TF32 term's maximum. On an accelerator each read is a wait for the device
    (fuzzattn/run/runs.py); these were four. Whether any row is empty is known from the lengths
    (Reference.some_empty), not read.

    Non-finite rows are found from those maxima rather than by a pass of their own: the max
    rule's error |got - oracle| is infinite exactly where got holds NaN or inf and the oracle is
    finite (NaN counts as inf there, and a difference of finite float32-range values cannot
    overflow float64), which is what nonfinite_rows marks; the one thing it leaves out, an lse
    of NaN where the oracle's is -inf (a row with no key), is one more maximum in the same read.
    Only then are the rows computed: ~10 operations fewer on every case that has none."""
    verdict = dict(impl=impl.name, case=case)
    if margins and not isinstance(spr, Reference):
        spr = spr()
    # The reference when it is at hand; else asked for (once) only if an error needs it.
    at_hand = spr if isinstance(spr, Reference) else None
    same_precision = (lambda: at_hand) if at_hand is not None else functools.cache(spr)
    bounds = _max_rule_differences(run, ref, at_hand, check_out, check_lse)
    read = _read_scalars(run, ref, bounds, impl.caps.fp32_matmul, find_nonfinite)
    nonfinite = None
    if find_nonfinite and read.holds_nonfinite:
        nonfinite = nonfinite_rows(run, ref)
    out_results = [_empty_rows_verdict(run, ref, verdict)] if ref.some_empty else []
    finished = functools.partial(_finished, run, read.score, impl.caps.fp32_matmul,
                                 read.scalars.get("summed", 0.0), margins)
    judged = [finished(got, d, maximum) for (_, got, d), maximum in zip(bounds, read.bounds)]
    if any(b is None for b in judged):
        at_hand = _decided_with_reference(bounds, judged, read.bounds, finished, same_precision,
                                          run)
    results, whole, err_finite = _max_rule_verdicts(bounds, judged, run, verdict)
    out_results += results
    # The error statistic over the whole output (error_statistics.py): precision bugs that stay
    # under the max rule in every element but add error to all of them.
    reference_out = (lambda: same_precision().out) if at_hand is None else at_hand.out
    s = out_rms_bound(run.out, reference_out, ref.out, ref.empty_rows if ref.some_empty else None,
                      read.score, ref.out_magnitude,
                      fp32_matmul=impl.caps.fp32_matmul, differences=whole, err_finite=err_finite,
                      margins=margins, reference_dtype=torch_dtype(case.dtype))
    bad = s.row_ratio > 1 if not s.ok else None
    out_results.append(Verdict(
        check=check_stat, passed=s.ok, error=s.statistic, allowed=s.allowed,
        where=locate(bad) if not s.ok else "", heatmap=heatmap(bad) if not s.ok else "",
        detail="" if s.ok else f"rms error over {s.elements} elements; same-precision reference "
                               f"rms {s.reference_statistic:.3g}", **verdict))
    return out_results, nonfinite


def _max_rule_differences(run: runs.Run, ref: Reference, at_hand: Reference | None,
                          check_out: str, check_lse: str) -> list[tuple]:
    """(check, the run's tensor, its tolerance.Differences) for out, and for lse when the run
    has one: every tensor the max rules compare, nothing read yet."""
    bounds = [(check_out, run.out,
               differences(run.out, None if at_hand is None else at_hand.out, ref.out))]
    if run.lse is not None:
        bounds.append((check_lse, run.lse,
                       differences(run.lse, None if at_hand is None else at_hand.lse, ref.lse)))
    return bounds


@dataclasses.dataclass(frozen=True)
class _Scalars:
    """What the one read of value_verdicts brought back."""
    bounds: list[list[float]]    # each bound's maxima, in the order of its Differences.maximised
    scalars: dict[str, float]    # "score", "summed", "nan_lse_left_out", where asked
    score: float                 # the oracle's score magnitude, read or as it was

    @property
    def holds_nonfinite(self) -> bool:
        """Whether the run holds NaN or inf where the oracle is finite (value_verdicts says why
        the maxima tell)."""
        return (any(worst == math.inf for worst, *_ in self.bounds)
                or self.scalars.get("nan_lse_left_out", 0.0) > 0)


def _read_scalars(run: runs.Run, ref: Reference, bounds: list[tuple], fp32_matmul: str,
                  find_nonfinite: bool) -> _Scalars:
    """Both bounds' maxima and the other scalars the max rules need, in one transfer."""
    extra = {}
    if isinstance(ref.score_magnitude, torch.Tensor):
        extra["score"] = ref.score_magnitude
    summed = summed_for_tf32(run.out.dtype, ref.out, ref.out_magnitude, fp32_matmul)
    if summed is not None:
        extra["summed"] = summed
    if find_nonfinite and run.lse is not None and bounds[-1][2].excluded is not None:
        extra["nan_lse_left_out"] = torch.isnan(run.lse) & bounds[-1][2].excluded
    read = iter(maxima(*(t for _, _, d in bounds for t in d.maximised), *extra.values()))
    bound_maxima = [[next(read) for _ in d.maximised] for _, _, d in bounds]
    scalars = dict(zip(extra, read))
    return _Scalars(bound_maxima, scalars, scalars.get("score", ref.score_magnitude))


def _empty_rows_verdict(run: runs.Run, ref: Reference, verdict: dict) -> Verdict:
    """Rows with no visible key must be out = 0 and lse = -inf exactly."""
    empty = ref.empty_rows
    # NaN != 0 as well: a NaN row is wrong without a test of its own.
    wrong = run.out[:, :, empty].ne(0).any(dim=-1)
    if run.lse is not None:
        wrong |= run.lse[:, :, empty] != float("-inf")
    failed = bool(wrong.any())
    bad = None
    if failed:
        bad = torch.zeros_like(ref.lse, dtype=torch.bool)
        bad[:, :, empty] = wrong
    return Verdict(
        check="empty_rows", passed=not failed, where=locate(bad) if failed else "",
        detail="rows with no visible key must be out=0, lse=-inf" if failed else "",
        heatmap=heatmap(bad) if failed else "", **verdict)


def _finished(run: runs.Run, score, fp32_matmul: str, summed_max: float, margins: bool,
              got: torch.Tensor, d, maximum: list[float]):
    """The max rule of out or lse (whichever `got` is) on `d`, given its maxima: a
    tolerance.Bound, or None when the error is above its noise and the reference is not in
    `d` yet (tolerance.py's tiers)."""
    if got is run.out:
        return out_finish(d, maximum, got.dtype, score, fp32_matmul, summed_max, margins=margins)
    return lse_finish(d, maximum, score, margins=margins)


def _decided_with_reference(bounds: list[tuple], judged: list, bound_maxima: list[list[float]],
                            finished, same_precision, run: runs.Run) -> Reference:
    """The bounds left undecided (errors above their noise) decided on the reference's errors,
    their maxima read in one transfer; `bounds` and `judged` updated in place. Returns the
    same-precision reference, now at hand."""
    undecided = [i for i, b in enumerate(judged) if b is None]
    at_hand = same_precision()
    for i in undecided:
        check, got, d = bounds[i]
        bounds[i] = (check, got, with_reference(d, at_hand.out if got is run.out
                                                else at_hand.lse))
    more = iter(maxima(*(bounds[i][2].ref_err for i in undecided)))
    for i in undecided:
        _, got, d = bounds[i]
        judged[i] = finished(got, d, bound_maxima[i] + [next(more)])
    return at_hand


def _max_rule_verdicts(bounds: list[tuple], judged: list, run: runs.Run,
                       verdict: dict) -> tuple[list[Verdict], tuple | None, bool]:
    """The verdicts of the max rules, with what out_rms reuses of out's: its float64
    differences (None without) and whether its worst error was finite."""
    results, whole, err_finite = [], None, False
    for (check, got, d), b in zip(bounds, judged):
        if got is run.out:
            whole, err_finite = b.differences, math.isfinite(b.error)
        bad = None if b.ok else (b.row_errors > b.allowed) | torch.isnan(b.row_errors)
        results.append(Verdict(
            check=check, passed=b.ok, error=b.error, allowed=b.allowed,
            where=locate(bad) if not b.ok else "", heatmap=heatmap(bad) if not b.ok else "",
            detail="" if b.ok else f"same-precision reference error {b.reference_error:.3g}",
            **verdict))
    return results, whole, err_finite
