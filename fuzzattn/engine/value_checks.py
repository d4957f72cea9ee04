"""The value checks of one run against the references: rows with no visible key, the max rule for
out and lse, out_rms, and the rows holding NaN or inf where the oracle is finite (named by
re-running with clean memory). The rules themselves, and their constants: tolerance.py and
error_statistics.py; where the checks compute: judge_device.py.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch

from fuzzattn.engine import runs
from fuzzattn.engine.error_statistics import out_rms_bound, out_rms_finish, out_rms_sums
from fuzzattn.engine.judge_device import moved
from fuzzattn.engine.oracle import Reference
from fuzzattn.engine.tolerance import (all_finite, differences, lse_finish, maxima, out_finish,
                                       summed_for_tf32)
from fuzzattn.engine.transfer import same_device
from fuzzattn.engine.verdict import Verdict, heatmap, locate


def run_on(run: runs.Run, device: torch.device) -> runs.Run:
    """`run` with its out and lse on `device`, where the judgement computes (judge_device.py)."""
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


def _launched_bounds(impl, run: runs.Run, ref: Reference, spr: Reference, check_out: str,
                     check_lse: str, find_nonfinite: bool) -> tuple[list, dict]:
    """The max rules' tensors (tolerance.differences) of out and lse, and the other tensors
    whose maxima the value checks read with theirs, by name; nothing read."""
    bounds = [(check_out, run.out, differences(run.out, spr.out, ref.out))]
    if run.lse is not None:
        bounds.append((check_lse, run.lse, differences(run.lse, spr.lse, ref.lse)))
    extra = {"empty": ref.empty_rows}
    if isinstance(ref.score_magnitude, torch.Tensor):
        extra["score"] = ref.score_magnitude
    summed = summed_for_tf32(run.out.dtype, ref.out, ref.out_magnitude, impl.caps.fp32_matmul)
    if summed is not None:
        extra["summed"] = summed
    if find_nonfinite and run.lse is not None and bounds[-1][2].excluded is not None:
        extra["nan_lse_left_out"] = torch.isnan(run.lse) & bounds[-1][2].excluded
    return bounds, extra


def _split(bounds: list, extra: dict, values) -> tuple[list[list[float]], dict[str, float]]:
    """The maxima read for `_launched_bounds`' tensors, in their order: three a bound, then the
    extra ones by name."""
    read = iter(values)
    bound_maxima = [[next(read) for _ in range(3)] for _ in bounds]
    return bound_maxima, dict(zip(extra, read))


def _has_nonfinite(bound_maxima, scalars) -> bool:
    """Whether a max rule's worst error is infinite (NaN or inf where the oracle is finite) or
    an lse the rule left out is NaN (value_verdicts' docstring)."""
    return (any(worst == math.inf for worst, _, _ in bound_maxima)
            or scalars.get("nan_lse_left_out", 0.0) > 0)


def _empty_rows_verdict(verdict: dict, failed: bool, bad: torch.Tensor | None) -> Verdict:
    return Verdict(check="empty_rows", passed=not failed, where=locate(bad) if failed else "",
                   detail="rows with no visible key must be out=0, lse=-inf" if failed else "",
                   heatmap=heatmap(bad) if failed else "", **verdict)


def _bound_verdicts(run: runs.Run, bounds: list, bound_maxima, score: float, fp32_matmul: str,
                    summed_max: float, verdict: dict) -> tuple[list[Verdict], bool]:
    """The max rules' verdicts of out and lse, and whether out's worst error was finite."""
    results, err_finite = [], False
    for (check, got, d), maximum in zip(bounds, bound_maxima):
        if got is run.out:
            b = out_finish(d, maximum, got.dtype, score, fp32_matmul, summed_max)
            err_finite = math.isfinite(b.error)
        else:
            b = lse_finish(d, maximum, score)
        bad = None if b.ok else (b.row_errors > b.allowed) | torch.isnan(b.row_errors)
        results.append(Verdict(
            check=check, passed=b.ok, error=b.error, allowed=b.allowed,
            where=locate(bad) if not b.ok else "", heatmap=heatmap(bad) if not b.ok else "",
            detail="" if b.ok else f"same-precision reference error {b.reference_error:.3g}",
            **verdict))
    return results, err_finite


def _statistic_verdict(check: str, s, verdict: dict) -> Verdict:
    bad = s.row_ratio > 1 if not s.ok else None
    return Verdict(
        check=check, passed=s.ok, error=s.statistic, allowed=s.allowed,
        where=locate(bad) if not s.ok else "", heatmap=heatmap(bad) if not s.ok else "",
        detail="" if s.ok else f"rms error over {s.elements} elements; same-precision reference "
                               f"rms {s.reference_statistic:.3g}", **verdict)


def value_verdicts(impl, case, run: runs.Run, ref: Reference, spr: Reference, *,
                   check_out="out", check_lse="lse", check_stat="out_rms",
                   find_nonfinite: bool = True) -> tuple[list[Verdict], torch.Tensor | None]:
    """The value checks of one run (empty rows, the max rule for out and lse, out_rms), and
    (`find_nonfinite`) the rows holding NaN/inf where the oracle is finite (nonfinite_rows),
    None when there are none.

    Every scalar the max rules need is read in one transfer (tolerance.maxima): both bounds'
    maxima, the oracle's score magnitude while it is a 0-d tensor (computed on the accelerator
    the checks run on), the TF32 term's maximum, and whether any row is empty. On an
    accelerator each read is a wait for the device (engine/runs.py); these were five. (A case
    checked on the accelerator reads every scalar of its judgement at once instead:
    `value_reads`.)

    Non-finite rows are found from those maxima rather than by a pass of their own: the max
    rule's error |got - oracle| is infinite exactly where got holds NaN or inf and the oracle is
    finite (NaN counts as inf there, and a difference of finite float32-range values cannot
    overflow float64), which is what nonfinite_rows marks; the one thing it leaves out, an lse
    of NaN where the oracle's is -inf (a row with no key), is one more maximum in the same read.
    Only then are the rows computed: ~10 operations fewer on every case that has none."""
    verdict = dict(impl=impl.name, case=case)
    out_results = []
    empty = ref.empty_rows
    fp32_matmul = impl.caps.fp32_matmul
    bounds, extra = _launched_bounds(impl, run, ref, spr, check_out, check_lse, find_nonfinite)
    bound_maxima, scalars = _split(bounds, extra, maxima(
        *(t for _, _, d in bounds for t in d.maximised), *extra.values()))
    nonfinite = None
    if find_nonfinite and _has_nonfinite(bound_maxima, scalars):
        nonfinite = nonfinite_rows(run, ref)
    score = scalars.get("score", ref.score_magnitude)
    has_empty = scalars["empty"] > 0
    if has_empty:
        # NaN != 0 as well: a NaN row is wrong without a test of its own.
        wrong = run.out[:, :, empty].ne(0).any(dim=-1)
        if run.lse is not None:
            wrong |= run.lse[:, :, empty] != float("-inf")
        failed = bool(wrong.any())
        bad = None
        if failed:
            bad = torch.zeros_like(ref.lse, dtype=torch.bool)
            bad[:, :, empty] = wrong
        out_results.append(_empty_rows_verdict(verdict, failed, bad))
    bound_results, err_finite = _bound_verdicts(run, bounds, bound_maxima, score, fp32_matmul,
                                                scalars.get("summed", 0.0), verdict)
    out_results += bound_results
    # The error statistic over the whole output (error_statistics.py): precision bugs that stay
    # under the max rule in every element but add error to all of them.
    s = out_rms_bound(run.out, spr.out, ref.out, empty if has_empty else None,
                      score, ref.out_magnitude, fp32_matmul=fp32_matmul,
                      differences=bounds[0][2].whole, err_finite=err_finite)
    out_results.append(_statistic_verdict(check_stat, s, verdict))
    return out_results, nonfinite


@dataclasses.dataclass
class ValueReads:
    """value_verdicts in two phases, for a case checked on the accelerator (judge.py): `reads`,
    0-d tensors launched and not read, and `finish(values)` (their values, in order) -> what
    value_verdicts returns, the same verdicts."""
    reads: list[torch.Tensor | float]
    finish: Callable[[list[float]], tuple[list[Verdict], torch.Tensor | None]]


def value_reads(impl, case, run: runs.Run, ref: Reference, spr: Reference) -> ValueReads:
    """Every tensor of value_verdicts' checks launched before any is read, so that one read
    (with the runs' flags: judge.py) serves them all: the max rules' maxima, and what
    value_verdicts decides from them before launching more, launched regardless. The empty
    rows' check runs over every row and is masked to the empty ones (indexing by the mask
    would wait for its count); out_rms masks the empty rows (none: a no-op) and looks for
    non-finite entries itself (finite: a no-op), so its sums are value_verdicts' to the bit."""
    verdict = dict(impl=impl.name, case=case)
    empty = ref.empty_rows
    fp32_matmul = impl.caps.fp32_matmul
    bounds, extra = _launched_bounds(impl, run, ref, spr, "out", "lse", True)
    # The maxima first: out_rms masks the max rule's tensors in place, as in value_verdicts,
    # where the maxima are read before it (in stream order here).
    maximised = [t for _, _, d in bounds for t in d.maximised] + list(extra.values())
    reads = [t.max().to(torch.float64) if t.numel() else 0.0 for t in maximised]
    # NaN != 0 as well: a NaN row is wrong without a test of its own.
    wrong = run.out.ne(0).any(dim=-1)
    if run.lse is not None:
        wrong |= run.lse != float("-inf")
    wrong &= empty.to(wrong.device)
    rms = out_rms_sums(run.out, spr.out, ref.out, empty, ref.out_magnitude,
                       fp32_matmul=fp32_matmul, differences=bounds[0][2].whole)
    reads += [wrong.any().to(torch.float64)] + rms.reads

    def finish(values: list[float]):
        values = list(values)
        bound_maxima, scalars = _split(bounds, extra, values[:len(maximised)])
        empty_wrong = values[len(maximised)] > 0
        nonfinite = nonfinite_rows(run, ref) if _has_nonfinite(bound_maxima, scalars) else None
        score = scalars.get("score", ref.score_magnitude)
        results = []
        if scalars["empty"] > 0:
            results.append(_empty_rows_verdict(verdict, empty_wrong,
                                               wrong if empty_wrong else None))
        results += _bound_verdicts(run, bounds, bound_maxima, score, fp32_matmul,
                                   scalars.get("summed", 0.0), verdict)[0]
        s = out_rms_finish(rms, values[len(maximised) + 1:], score)
        results.append(_statistic_verdict("out_rms", s, verdict))
        return results, nonfinite

    return ValueReads(reads, finish)
