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
    reference's output is rounded to, when narrower than fp32: a middle tier (below).

    The steps, in order: the errors, the magnitudes that set the noise, every sum in one read,
    the noise, then the tiers (tolerance.py): the noise alone, the oracle's own rounding to the
    reference's dtype, the reference's rms error; a failure's rows last, for its location."""
    tf32 = reads_tf32(got.dtype, fp32_matmul)
    k_rms = K_RMS_TF32 if tf32 else K_RMS
    masked = _Masked.of(oracle, empty_rows)
    if differences is None:
        differences = (got.to(torch.float64) - masked.oracle64, None, None)
    err, ref_err, nonfinite = _errors(masked, reference, differences, err_finite)
    m, s = _magnitudes(masked, differences[2], out_magnitude)
    sums = _read_sums(masked, err, ref_err, m, s, _rounding(masked, reference_dtype, margins),
                      nonfinite, tf32)
    n = sums.n
    noise, max_noise = _noise(sums, got.dtype, score_magnitude, fp32_matmul, tf32)
    floor = max_noise
    statistic = math.inf if sums.any_nonfinite else _rms(sums.err_sq, n)
    if statistic <= max(noise, floor) and not margins:   # decided on the noise (tolerance.py's
        return StatBound(statistic, max(noise, floor), math.nan, n, None)            # tiers)
    sampling = rms_sampling(n, RMS_FALSE_POSITIVE_RATE)      # past the noise tier only
    round_sq = sums.round_sq
    if round_sq is not None and math.isfinite(round_sq):   # (an oracle past the dtype's range
        rounded_allowed = max(k_rms * sampling * _rms(round_sq, n) + noise, floor)   # rounds to
        if statistic <= rounded_allowed:                                             # inf: no tier)
            return StatBound(statistic, rounded_allowed, math.nan, n, None)
    ref_sq = sums.ref_sq
    if ref_err is None:
        ref_err = masked.reference_error(reference())
        ref_sq = float(_dot(ref_err))
    ref_rms = _rms(ref_sq, n)
    if n == 1:
        floor = tolerance.K_OUT * ref_rms + max_noise
    allowed = max(k_rms * sampling * ref_rms + noise, floor)
    if statistic <= allowed:
        return StatBound(statistic, allowed, ref_rms, n, None)
    row_ratio = _row_ratio(err, ref_err, nonfinite, k_rms * sampling, noise, floor)
    return StatBound(statistic, allowed, ref_rms, n, row_ratio)


@dataclasses.dataclass(frozen=True)
class _Masked:
    """The float64 oracle, and the rows left out: rows with no visible key are zeroed (in place,
    on fresh tensors: tolerance.differences says why) and not counted. Without any (`drop`
    None), nothing is masked."""
    oracle64: torch.Tensor
    drop: torch.Tensor | None    # (B, H, Nq, D) bool: True in the rows left out

    @classmethod
    def of(cls, oracle: torch.Tensor, empty_rows: torch.Tensor | None) -> _Masked:
        oracle64 = oracle.to(torch.float64)
        drop = None if empty_rows is None else \
            empty_rows.to(oracle64.device)[:, None].expand(oracle64.shape)
        return cls(oracle64, drop)

    def kept(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.drop is None else t.masked_fill_(self.drop, 0.0)

    def reference_error(self, reference: torch.Tensor) -> torch.Tensor:
        return self.kept((reference.to(torch.float64) - self.oracle64).contiguous())


def _errors(masked: _Masked, reference, differences: tuple, err_finite: bool):
    """(err, the reference's error or None, the (B, H, Nq, D) non-finite entries of err or None),
    masked; err's non-finite entries zeroed (they count through the flag)."""
    # Made contiguous first: the sums of squares below then add in the same order whatever
    # layout the implementation's output has.
    err = masked.kept(differences[0].contiguous())
    ref_err = None if differences[1] is None else masked.kept(differences[1].contiguous())
    if ref_err is None and isinstance(reference, torch.Tensor):
        # at hand: squared in the same read as the rest
        ref_err = masked.reference_error(reference)
    # A NaN or inf anywhere makes the statistic infinite: it fails, as under the max rule.
    # (`err_finite`: the caller's max rule already found err finite, from the same tensor.)
    nonfinite = None
    if not (err_finite and differences[2] is not None) and not all_finite(err):
        infinite = ~torch.isfinite(err)
        nonfinite = infinite if masked.drop is None else infinite & ~masked.drop
        err.masked_fill_(infinite, 0.0)
    return err, ref_err, nonfinite


def _magnitudes(masked: _Masked, magnitude: torch.Tensor | None,
                out_magnitude: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, s): each element's own rounding scale is the output dtype's rounding at |out|
    (m = |oracle|, `magnitude` when the max rule formed it), plus fp32 summation rounding at the
    size of the terms summed (s, far above |out| where they cancel): scale = u m + U32 s. Scores
    off by up to d = SCORE_ULPS u(fp32) S move out_i = sum_j p_j v_j by sum_j p_j delta_j
    (v_j - out_i), at most d (A_i + |out_i|): moved = s + m, a per-element bound, so a bound on
    the rms. `s is m` without `out_magnitude`."""
    drop = masked.drop
    magnitude = masked.oracle64.abs() if magnitude is None else magnitude
    m = magnitude if drop is None else magnitude.masked_fill(drop, 0.0)
    s = m if out_magnitude is None else out_magnitude.to(torch.float64)
    if s is not m and drop is not None:
        s = s.masked_fill(drop, 0.0)        # not in place: it may be the oracle's own tensor
    return m, s


def _rounding(masked: _Masked, reference_dtype: torch.dtype | None,
              margins: bool) -> torch.Tensor | None:
    """The middle tier's error: the oracle's own rounding to `reference_dtype`, or None. A
    reference whose output is a `reference_dtype` value is no closer to the oracle, element by
    element, than the oracle's own rounding to that dtype (the nearest such value), so K_RMS
    times that rounding's rms, plus the noise, is at most the whole allowance: a statistic
    within it passes without the reference. (Measured on 300 ci cases each: every sdpa and
    torch_tiled bf16 and fp16 out_rms within it, about half of them above the noise alone.)
    Formed only where the noise alone will often not do, narrower than fp32, and also when the
    reference is at hand (on a device): a case reports the same allowance wherever it is
    judged."""
    if reference_dtype is None or margins or unit_roundoff(reference_dtype) <= U32:
        return None
    oracle64 = masked.oracle64
    return masked.kept((oracle64.to(reference_dtype).to(torch.float64) - oracle64).contiguous())


@dataclasses.dataclass(frozen=True)
class _Sums:
    """Every scalar out_rms needs, read back together."""
    n: int                       # elements judged
    err_sq: float                # sum err^2
    mm: float                    # sum m^2
    ss: float                    # sum s^2 (mm when s is m)
    ms: float                    # sum m s (mm when s is m)
    ref_sq: float | None         # sum ref_err^2, when the reference's error was at hand
    round_sq: float | None       # sum of the middle tier's rounding^2, when formed
    any_nonfinite: bool
    magnitude_max: float         # max m, for a single element's floor (else 0)
    summed_max: float            # max s, for a single TF32 element's floor (else 0)
    single: bool                 # whether a single element may be all there is to judge


def _read_sums(masked: _Masked, err: torch.Tensor, ref_err: torch.Tensor | None,
               m: torch.Tensor, s: torch.Tensor, rounding: torch.Tensor | None,
               nonfinite: torch.Tensor | None, tf32: bool) -> _Sums:
    """The sums of squares from dot products (sum m^2, sum s^2 and sum m s, expanded: no
    (B, H, Nq, D) float64 temporaries, each of which was fresh pages to fault in on the host;
    measured: 1.85 -> 1.24 ms per call of these checks on a 307,200-element output on the CPU,
    the squares' products had been 70% of it; each dot is one pass, over contiguous memory),
    and every other scalar, in one read-back (a wait per read on a time-sliced GPU:
    fuzzattn/run/runs.py)."""
    dots = [_dot(err), _dot(m)] + ([] if s is m else [_dot(s), _dot(m, s)])
    referenced = [] if ref_err is None else [_dot(ref_err)]
    rounded = [] if rounding is None else [_dot(rounding)]
    flagged = [] if nonfinite is None else [nonfinite.any().to(torch.float64)]
    counted = [] if masked.drop is None else [masked.drop.logical_not().sum().to(torch.float64)]
    # One element's floor needs the max rule's noise: max|oracle| and (TF32) the largest A. Only
    # a head dim of 1 can leave a single element to judge.
    single = masked.oracle64.shape[-1] == 1 and m.numel() > 0
    largest = ([m.max()] + ([s.max()] if tf32 else [])) if single else []
    sums = torch.stack(dots + referenced + rounded + flagged + counted + largest).tolist()
    summed_max = sums.pop() if single and tf32 else 0.0
    magnitude_max = sums.pop() if single else 0.0
    n = int(sums.pop()) if counted else masked.oracle64.numel()
    any_nonfinite = bool(sums.pop()) if flagged else False
    round_sq = sums.pop() if rounded else None
    ref_sq = sums.pop() if referenced else None
    err_sq, mm, *rest = sums
    ss, ms = rest if rest else (mm, mm)
    return _Sums(n, err_sq, mm, ss, ms, ref_sq, round_sq, any_nonfinite, magnitude_max,
                 summed_max, single)


def _noise(sums: _Sums, dtype: torch.dtype, score_magnitude: float, fp32_matmul: str,
           tf32: bool) -> tuple[float, float]:
    """(noise, max_noise): the rounding noise every output carries, as an rms, and the max
    rule's noise for a single element, the least it is allowed (0 for more elements)."""
    n = sums.n
    u = unit_roundoff(dtype)
    magnitude_rms, summed_rms = (_rms(sq, n) for sq in (sums.mm, sums.ss))
    scale_rms = _rms(u * u * sums.mm + 2 * u * U32 * sums.ms + U32 * U32 * sums.ss, n)
    moved_rms = _rms(sums.ss + 2 * sums.ms + sums.mm, n)

    one_element = EPS_ULPS * scale_rms / math.sqrt(n) if n else 0.0
    # One element: the rms *is* its error, which the max rule judges; the rms rule then allows
    # at least what the max rule does (tolerance.py, "one element"). The tiers before the
    # reference use the max rule's noise alone, a part of that.
    max_noise = (out_noise(dtype, score_magnitude, sums.magnitude_max, fp32_matmul,
                           sums.summed_max) if n == 1 and sums.single else 0.0)
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
    return noise, max_noise


def _row_ratio(err: torch.Tensor, ref_err: torch.Tensor, nonfinite: torch.Tensor | None,
               k: float, noise: float, floor: float) -> torch.Tensor:
    """Per row, for the failure's location only: the row's rms against `k` (K_RMS and the
    sampling factor) times the reference row's plus the tensor's noise term, so the rows that
    carry the excess are the ones shown. (A row of D elements is too few to judge on its own;
    the verdict is the tensor's.)"""
    row_rms = err.pow(2).mean(dim=-1).sqrt() if err.numel() else err.sum(-1)
    row_ref = ref_err.pow(2).mean(dim=-1).sqrt() if err.numel() else err.sum(-1)
    row_allowed = (k * row_ref + noise).clamp_min(floor)
    row_ratio = torch.where(row_allowed > 0, row_rms / row_allowed.clamp_min(1e-300),
                            (row_rms > 0).to(torch.float64) * math.inf)
    if nonfinite is not None:
        row_ratio = row_ratio.masked_fill(nonfinite.any(dim=-1), math.inf)
    return row_ratio
