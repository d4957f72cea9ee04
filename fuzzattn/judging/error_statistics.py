"""The error-statistics check (`out_rms`): how much error an output carries overall, not at worst.

Why a second rule beside the max rule (tolerance.py): a precision bug that rounds the running
output accumulator to bf16 after every key block adds a few roundings to *every* element, yet
each element's error stays one or two units of roundoff. The worst element of such an output is
often within the max rule's bound (2x the reference's worst error), so the max rule misses it.
Over a whole tensor, though, the error is consistently larger than the reference's: the
statistic below moves by a factor of 1.2-3 where a correct kernel's moves by a few percent.

Statistic: the root mean square of |out - oracle| over the whole output tensor (every batch,
head, query row and column; rows with no visible key are left out, since out = 0 there is exact
and checked by `empty_rows`). Chosen over

* per-row statistics: a row holds D elements (D can be 1), too few for a statistic of rounding
  errors to settle; the bugs this check targets touch every row alike, so pooling all rows
  gives the most averaging. Rows are still reported, for locating;
* an ulp-normalised statistic (each element's error over its own rounding scale, so every row
  weighs the same): measured on 300 bf16 and 300 fp16 cases per kernel, it separates the
  precision mutants from sdpa and torch_tiled no better (34-39% of a mutant's cases above 1.2x
  the reference, against 35-40% for the plain rms) and spreads wider on sdpa fp16 (up to 1.73x
  on cases of fewer than 16 elements, against 1.46x): the mutants hide in cases whose reference
  is exact or nearly so (one-hot softmax rows, a lone visible key), which no weighting changes;
* a relative (per-element) error: elements near zero make it unstable.

Bound (constants and their reasoning in tolerance.py, section "error statistics"):

    allowed = K_RMS * c(n) * rms|ref - oracle|
              + EPS_ULPS * rms(u(dtype) |oracle| + u(fp32) A) / sqrt(n)
              + SCORE_ULPS u(fp32) S rms(A + |oracle|) + NORM_ULPS ULP32 rms|oracle|
    and, on a single element, at least the max rule's allowance

n is the number of elements judged, c(n) how far the ratio of two rms over n elements strays by
chance (sampling.py: the F(n, n) quantile, huge for a few elements, near 1 for thousands), S the score magnitude of the max rule, A = sum_j p_j |v_j| / l
per element (oracle.Reference.out_magnitude). The second term is one element of typical size a
rounding or two off where the reference happens to be right, spread over the n elements (the
rms of an error that sits in one element): it keeps exact or nearly exact references from
turning a rounding that fell the other way into a failure, and vanishes on large tensors. An
element rounds at two scales: the output dtype's rounding at |out|, and the fp32 sum of the
terms p_j v_j at their size A, which is far above |out| when they cancel (derivation and the
false positive that showed it in tolerance.py). The third is the max rule's score-rounding
allowance, taken per element: scores off by d move out_i by at most d (A_i + |out_i|), and a
per-element bound on an effect bounds its rms too. (The max rule scales it by max(max|out|,
FLOOR), the worst element's A standing in; the rms needs the typical element's.) The last is
the max rule's allowance for an approximate reciprocal in the final normalisation, per element.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from fuzzattn.contract.dtypes import TF32_ROUNDOFF, U32, reads_tf32, unit_roundoff
from fuzzattn.judging import tolerance
from fuzzattn.judging.sampling import rms_sampling
from fuzzattn.judging.tolerance import (EPS_ULPS, K_RMS, K_RMS_TF32, RMS_FALSE_POSITIVE_RATE,
                                       SCORE_ULPS, ULP32, all_finite, out_noise)


@dataclasses.dataclass(frozen=True)
class StatBound:
    statistic: float             # rms |got - oracle| over the judged elements (inf if any is NaN)
    allowed: float               # as tolerance.Bound.allowed: the noise alone when the
                                 # statistic is within it (and not `margins`), else the whole rule
    reference_statistic: float   # rms |reference - oracle| over the same elements (NaN: not needed)
    elements: int                # n: how many elements were judged
    row_ratio: torch.Tensor | None   # (B, H, Nq): each row's rms error over the reference
                                     # row's allowance, locating the rows that carry the excess;
                                     # computed for a failure only (None when the tensor passes)

    @property
    def ok(self) -> bool:
        return self.statistic <= self.allowed

    @property
    def ratio(self) -> float:
        """statistic / allowed: above 1 fails. 0 when nothing was judged."""
        if self.allowed > 0:
            return self.statistic / self.allowed
        return 0.0 if self.statistic == 0 else math.inf


def _rms(sum_of_squares: float, n: int) -> float:
    return math.sqrt(sum_of_squares / n) if n else 0.0


def _dot(a: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """sum(a * b) (b defaults to a) as a 0-d float64 tensor: one BLAS pass, no temporary."""
    a = a.reshape(-1)
    return torch.dot(a, a if b is None else b.reshape(-1))


def out_rms_bound(got: torch.Tensor, reference, oracle: torch.Tensor,
                  empty_rows: torch.Tensor | None = None, score_magnitude: float = 0.0,
                  out_magnitude: torch.Tensor | None = None,
                  fp32_matmul: str = "ieee", differences: tuple | None = None,
                  err_finite: bool = False, margins: bool = False,
                  reference_dtype: torch.dtype | None = None) -> StatBound:
    """Judge the output `got` (B, H, Nq, D) by its rms error against the float64 `oracle`,
    compared with the rms error of the same-precision `reference`; `empty_rows` (Nq,) bool marks
    rows with no visible key, which are left out; `out_magnitude` (the oracle's sum_j p |v| / l
    per element, oracle.Reference.out_magnitude) sets the fp32 summation noise, |oracle|
    standing in without.
    `fp32_matmul="tf32"` (the implementation's declaration) judges fp32 outputs with K_RMS_TF32.
    `reference`: the reference's output, or a function returning it, called only when the
    statistic is above the noise alone (tiers and `margins`: tolerance.py).
    `differences`: the max rule's |got - oracle|, |reference - oracle| (or None) and |oracle| of
    these same tensors (tolerance.Bound.differences), squared here instead of formed again: the
    same squares (|x|^2 is x^2 exactly; its NaN as inf is non-finite all the same). Masked in
    place. `err_finite`: with `differences`, the max rule's worst error was finite (so every
    entry of that err is): the pass asking again is skipped. `reference_dtype`: the dtype the
    reference's output is rounded to, when narrower than fp32: a middle tier (below)."""
    tf32 = reads_tf32(got.dtype, fp32_matmul)
    k_rms = K_RMS_TF32 if tf32 else K_RMS
    oracle64 = oracle.to(torch.float64)
    # Rows with no visible key are left out: zeroed (in place, on fresh tensors:
    # tolerance.differences says why) and not counted. Without any (`empty_rows` None), nothing
    # is masked.
    drop = None if empty_rows is None else \
        empty_rows.to(oracle64.device)[:, None].expand(oracle64.shape)

    def kept(t: torch.Tensor) -> torch.Tensor:
        return t if drop is None else t.masked_fill_(drop, 0.0)

    def reference_error(reference: torch.Tensor) -> torch.Tensor:
        return kept((reference.to(torch.float64) - oracle64).contiguous())

    # Made contiguous first: the sums of squares below then add in the same order whatever
    # layout the implementation's output has.
    if differences is None:
        differences = (got.to(torch.float64) - oracle64, None, None)
    err = kept(differences[0].contiguous())
    ref_err = None if differences[1] is None else kept(differences[1].contiguous())
    if ref_err is None and isinstance(reference, torch.Tensor):
        ref_err = reference_error(reference)    # at hand: squared in the same read as the rest
    # A NaN or inf anywhere makes the statistic infinite: it fails, as under the max rule.
    # (`err_finite`: the caller's max rule already found err finite, from the same tensor.)
    nonfinite = None
    if not (err_finite and differences[2] is not None) and not all_finite(err):
        infinite = ~torch.isfinite(err)
        nonfinite = infinite if drop is None else infinite & ~drop
        err.masked_fill_(infinite, 0.0)
    # Each element's own rounding scale: the output dtype's rounding at |out| (m = |oracle|),
    # plus fp32 summation rounding at the size of the terms summed (s, far above |out| where
    # they cancel): scale = u m + U32 s. Scores off by up to d = SCORE_ULPS u(fp32) S move
    # out_i = sum_j p_j v_j by sum_j p_j delta_j (v_j - out_i), at most d (A_i + |out_i|):
    # moved = s + m, a per-element bound, so a bound on the rms.
    magnitude = oracle64.abs() if differences[2] is None else differences[2]
    m = magnitude if drop is None else magnitude.masked_fill(drop, 0.0)
    s = m if out_magnitude is None else out_magnitude.to(torch.float64)
    if s is not m and drop is not None:
        s = s.masked_fill(drop, 0.0)        # not in place: it may be the oracle's own tensor
    # Their sums of squares from three dot products, sum m^2, sum s^2 and sum m s, expanded:
    # no (B, H, Nq, D) float64 temporaries, each of which was fresh pages to fault in on the
    # host (measured: 1.85 -> 1.24 ms per call of these checks on a 307,200-element output
    # on the CPU; the squares' products had been 70% of it). Each dot is one pass, over contiguous memory.
    dots = [_dot(err), _dot(m)] + ([] if s is m else [_dot(s), _dot(m, s)])
    referenced = [] if ref_err is None else [_dot(ref_err)]
    # The middle tier: a reference whose output is a `reference_dtype` value is no closer to the
    # oracle, element by element, than the oracle's own rounding to that dtype (the nearest such
    # value), so K_RMS times that rounding's rms, plus the noise, is at most the whole
    # allowance: a statistic within it passes without the reference. (Measured on 300 ci cases
    # each: every sdpa and torch_tiled bf16 and fp16 out_rms within it, about half of them above
    # the noise alone.) Formed only where the noise alone will often not do, narrower than fp32,
    # and also when the reference is at hand (on a device): a case reports the same allowance
    # wherever it is judged.
    rounding = None
    if reference_dtype is not None and not margins and unit_roundoff(reference_dtype) > U32:
        rounding = kept((oracle64.to(reference_dtype).to(torch.float64) - oracle64).contiguous())
    rounded = [] if rounding is None else [_dot(rounding)]
    flagged = [] if nonfinite is None else [nonfinite.any().to(torch.float64)]
    counted = [] if drop is None else [drop.logical_not().sum().to(torch.float64)]
    # One element's floor needs the max rule's noise: max|oracle| and (TF32) the largest A. Only
    # a head dim of 1 can leave a single element to judge.
    single = oracle64.shape[-1] == 1 and m.numel() > 0
    largest = ([m.max()] + ([s.max()] if tf32 else [])) if single else []
    # Every scalar in one read-back (a wait per read on a time-sliced GPU: fuzzattn/run/runs.py).
    sums = torch.stack(dots + referenced + rounded + flagged + counted + largest).tolist()
    summed_max = sums.pop() if single and tf32 else 0.0
    magnitude_max = sums.pop() if single else 0.0
    n = int(sums.pop()) if counted else oracle64.numel()
    any_nonfinite = bool(sums.pop()) if flagged else False
    round_sq = sums.pop() if rounded else None
    ref_sq = sums.pop() if referenced else None
    err_sq, mm, *rest = sums
    ss, ms = rest if rest else (mm, mm)
    u = unit_roundoff(got.dtype)
    err_rms, magnitude_rms, summed_rms = (_rms(sq, n) for sq in (err_sq, mm, ss))
    scale_rms = _rms(u * u * mm + 2 * u * U32 * ms + U32 * U32 * ss, n)
    moved_rms = _rms(ss + 2 * ms + mm, n)

    one_element = EPS_ULPS * scale_rms / math.sqrt(n) if n else 0.0
    # One element: the rms *is* its error, which the max rule judges; the rms rule then allows
    # at least what the max rule does (tolerance.py, "one element"). The tiers before the
    # reference use the max rule's noise alone, a part of that.
    max_noise = (out_noise(got.dtype, score_magnitude, magnitude_max, fp32_matmul, summed_max)
                 if n == 1 and single else 0.0)
    floor = max_noise
    # An approximate reciprocal in the final normalisation (tolerance.py, NORM_ULPS) scales every
    # element by (1 + delta), |delta| <= NORM_ULPS ULP32: a per-element bound, so on the rms too
    # (seen: sdpa_efficient fp32 at 8.6e-8 against 5.3e-8 on 16 elements whose reference was
    # exact, the 2-ulp normalisation of NORM_ULPS; docs/CALIBRATION.md#norm-ulps).
    normalisation = tolerance.NORM_ULPS * ULP32 * magnitude_rms
    noise = one_element + normalisation + SCORE_ULPS * U32 * score_magnitude * moved_rms
    # Weights truncated to TF32 a unit apart from the reference's (tolerance.py, TF32_WEIGHT_ULPS)
    # move each element by at most TF32_WEIGHT_ULPS u_mm A: per element, so on the rms too.
    if tf32:
        noise += tolerance.TF32_WEIGHT_ULPS * TF32_ROUNDOFF * summed_rms
    statistic = math.inf if any_nonfinite else err_rms
    if statistic <= max(noise, floor) and not margins:   # decided on the noise (tolerance.py's
        return StatBound(statistic, max(noise, floor), math.nan, n, None)            # tiers)
    sampling = rms_sampling(n, RMS_FALSE_POSITIVE_RATE)      # past the noise tier only
    if round_sq is not None and math.isfinite(round_sq):   # (an oracle past the dtype's range
        rounded_allowed = max(k_rms * sampling * _rms(round_sq, n) + noise, floor)   # rounds to
        if statistic <= rounded_allowed:                                             # inf: no tier)
            return StatBound(statistic, rounded_allowed, math.nan, n, None)
    if ref_err is None:
        ref_err = reference_error(reference())
        ref_sq = float(_dot(ref_err))
    ref_rms = _rms(ref_sq, n)
    if n == 1:
        floor = tolerance.K_OUT * ref_rms + max_noise
    allowed = max(k_rms * sampling * ref_rms + noise, floor)
    if statistic <= allowed:
        return StatBound(statistic, allowed, ref_rms, n, None)

    # Per row, for the failure's location only: the row's rms against K_RMS times the reference
    # row's plus the tensor's noise term, so the rows that carry the excess are the ones shown.
    # (A row of D elements is too few to judge on its own; the verdict is the tensor's.)
    row_rms = err.pow(2).mean(dim=-1).sqrt() if err.numel() else err.sum(-1)
    row_ref = ref_err.pow(2).mean(dim=-1).sqrt() if err.numel() else err.sum(-1)
    row_allowed = (k_rms * sampling * row_ref + noise).clamp_min(floor)
    row_ratio = torch.where(row_allowed > 0, row_rms / row_allowed.clamp_min(1e-300),
                            (row_rms > 0).to(torch.float64) * math.inf)
    if nonfinite is not None:
        row_ratio = row_ratio.masked_fill(nonfinite.any(dim=-1), math.inf)
    return StatBound(statistic, allowed, ref_rms, n, row_ratio)
