"""The one tolerance rule every implementation is judged by. All constants live here.

Rule (after FlashAttention's tests, ../shared/BUGS.md): an implementation's worst error against
the float64 oracle may be at most K times the worst error of a same-precision PyTorch reference
(`oracle.same_precision_reference`) against the same oracle, plus a rounding-noise epsilon:

    allowed = K * max|ref - oracle| + noise

    out: noise = (EPS_ULPS u(dtype) + SCORE_ULPS u(fp32) S) * max(|oracle out|, FLOOR)
    lse: noise = EPS_LSE_ULPS u(fp32) * max(|oracle lse|, FLOOR) + SCORE_ULPS u(fp32) S

where S = |scale| * max over visible (i, j) of sum_d |q_id k_jd|, the size of the terms an fp32
score sums (oracle.Reference.score_magnitude).

- K_OUT = 2: FlashAttention asserts forward error <= 2x its PyTorch reference's error.
- K_LSE = 2: the same rule applied to the logsumexp.
- EPS_ULPS = 2, u = unit roundoff of the output's dtype (2^-24 fp32, 2^-8 bf16, 2^-11 fp16):
  FlashAttention's epsilon is the error of rounding the reference output itself to the output
  dtype, measured as 2x that rounding on values near 0.3; two units of roundoff at the output's
  magnitude is that same quantity, computed without a probe. It keeps the bound from collapsing
  when the reference happens to be exact (tiny cases, one visible key).
- SCORE_ULPS = 4: an fp32 dot product summed in another order, or with scale * log2(e) folded
  into q for exp2 (fast kernels), or q and k pre-scaled by sqrt(scale) (PyTorch's math path),
  differs from the reference's (q.k) * scale by a few units of roundoff of S, the sum of the
  magnitudes it adds — far more than of |q.k| itself when terms cancel. An absolute score error
  d moves the output by about d relative, and the lse by d absolute (set by: SDPA fp32 at 4.8e-7
  against 3.6e-7 allowed without it; calibration: docs/CALIBRATION.md#score-ulps).
- lse is always float32. A tiled kernel forms it as m + log(l), where l went through a rescale,
  an exp and an add per key tile and a log at the end, each worth about one unit of fp32
  roundoff relative to l, i.e. absolute on log(l); the one-pass reference does fewer. So its
  epsilon is EPS_LSE_ULPS = 8 units of fp32 roundoff at |lse|'s magnitude (seen: 4.2 units on a
  fp16 case whose reference happened to be nearly exact).
- FLOOR = 1: the magnitude below which absolute, not relative, rounding noise is the right
  scale (outputs are convex combinations of V rows drawn from N(0, 1)).
- NORM_ULPS (see "What correct GPU kernels legitimately do" below): fp32 ulps of |out| for
  the final normalisation, added to out's relative noise: + NORM_ULPS ULP32.
- TF32_WEIGHT_ULPS (same section), TF32 fp32 kernels only: the weights truncated to TF32 apart
  from the reference's, + TF32_WEIGHT_ULPS u_mm max A, A = sum_j p_j |v_j| / l per element.
Errors are compared as float64 maxima over the whole tensor; the rows over the bound are
reported as the failure's location.

Gradients (dq, dk, dv; `grad_finish`), the same kind of rule against the gradient oracle and the
same-precision reference backward (fuzzattn/gradients/reference_gradients.py):

    allowed = K_GRAD * max|ref - oracle| + GRAD_EPS_ULPS u_op T + u_op T_delta
              + (expm1(2 SCORE_ULPS u(fp32) S) + (n + GRAD_EXTRA_OPS) u(fp32)) T_mag

with T, T_delta, T_mag the largest over the gradient's entries of gradients.reference_gradients.term_magnitudes:
T the sum of the entry's |terms| (e.g. |scale| sum_j |dS_ij| |k_j| for dq_i), T_delta the part
of it through Delta = dO . O, T_mag the sum of every product an fp32 sum forming it adds (|dS|
bounded by P (|dO|.|v| + |dO|.|O|)). Not |oracle| as for out: dq and dk are sums whose terms
cancel (every row's dS sums to zero), so their noise scales with the terms, and an entry can be
far smaller than its noise. One source of difference between a correct kernel and the reference
for each term:
- GRAD_EPS_ULPS u_op T, u_op = max(u(dtype), u_mm) (u_mm = 2^-11 for TF32 fp32 matmuls): P and
  dS are rounded to the input dtype as matmul operands and the gradient is rounded at the end;
  nearly equal fp32 values can round one unit apart, each moving the entry by about u_op T.
  GRAD_EPS_ULPS = 4: the P or dS operand, the result, and one each for the same roundings in the
  reference, whose error K_GRAD already counts only once.
- u_op T_delta: Delta uses the forward's O rounded to the input dtype; the kernel's and the
  reference's O may round apart by one unit, moving Delta by u |dO|.|O|.
- expm1(2 SCORE_ULPS u(fp32) S) T_mag: the recomputed scores and the forward's lse each differ by
  a few units of roundoff of S (as for out), so P = exp(s - lse) moves by a factor e^(+-2d):
  about 2d relatively for normal values, unbounded once u(fp32) S nears 1 (grad_noise).
- (n + GRAD_EXTRA_OPS) u(fp32) T_mag: fp32 sums over n terms (n = Nk for dq, Nq times the GQA
  group for dk and dv) in another order (tiles, a second pass), worst case n units of roundoff
  of their magnitudes, plus the dot products forming dP and Delta, the exp and the scale
  (GRAD_EXTRA_OPS = 8, as rounding.EXTRA_OPS).
- K_GRAD = 2: FlashAttention's tests bound dq, dk, dv by 2x the PyTorch reference's error.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from fuzzattn.contract.dtypes import TF32_ROUNDOFF, U32, reads_tf32, unit_roundoff

K_OUT = 2.0
K_LSE = 2.0
EPS_ULPS = 2.0
EPS_LSE_ULPS = 8.0
SCORE_ULPS = 4.0
FLOOR = 1.0
K_GRAD = 2.0
GRAD_EPS_ULPS = 4.0
GRAD_EXTRA_OPS = 8
RECOMPUTE_LIMIT = math.log(float(torch.finfo(torch.float32).max))   # ~88.7: exp's fp32 range

# -- What correct GPU kernels legitimately do -----------------------------------------------------
# The same-precision reference divides correctly rounded, exponentiates with torch.exp and sums in
# one order. Fused kernels do each differently, correctly; each difference is bounded here, or
# shown to be bounded by a term above, so that none of them can fail a correct kernel.
#
# An fp32 ulp relative to the value it sits on: ulp(x) = 2^(e-23) for |x| in [2^e, 2^(e+1)), so
# ulp(x) / |x| lies in (2^-24, 2^-23]: at most 2 units of roundoff.
ULP32 = 2.0 * U32
#
# Final normalisation, NORM_ULPS = 2. Kernels end with out = acc * rcp(l), one approximate
# reciprocal (PTX rcp.approx.f32 / MUFU.RCP: within 1 ulp of 1/l) and a correctly rounded
# multiply (1/2 ulp), or with a fast division built the same way, instead of the reference's
# correctly rounded acc / l (1/2 ulp). So the kernel's quotient lies within 1 + 1/2 + O(u) ulps of
# the exact one; rounded to fp32 it is a whole number of ulps away from it, at most 2: the
# relative error is at most 2 ULP32 = 4 u32 of |out| <= max(|oracle out|, FLOOR).
# (Set by: SDPA fp32, one key: v off by 2 ulps, the reference exact; docs/CALIBRATION.md#norm-ulps)
# The normalisation runs in the fp32 accumulator whatever the output dtype, so the term is in fp32
# ulps for every dtype. For bf16/fp16 outputs it is 2^-22 relative before the final rounding,
# which EPS_ULPS u(dtype) >= 2^-10 already covered; added anyway, it costs them nothing.
NORM_ULPS = 2.0
#
# exp2 with the scale folded in (p = exp2(s * scale * log2 e - m')): the folded constant and the
# score are rounded once more than the reference's, an absolute error of a few ulps of the score's
# terms on the exponent: that is SCORE_ULPS u32 S above, not a new term. ex2.approx's own error
# enters only through weights p != 1; where the reference is exact because every weight is exactly
# 1 (one visible key, equal scores, zero query rows), the exponent is exactly 0 and ex2(0) = 1
# exactly, so the kernel's weights are exact too. Elsewhere the reference's own exp rounding is of
# the same size and K_OUT = 2 allows twice it.
#
# TF32 weights, TF32_WEIGHT_ULPS = 2 (fp32 kernels whose matmuls read TF32 operands). Tensor cores
# read fp32 operands truncated to TF32 (every operand, from memory or registers, at each tile size
# probed; calibration: docs/CALIBRATION.md#tf32). q, k and v are
# inputs: kernel and reference truncate the same bits. The weights P are not: the kernel's fp32
# p_j and the reference's differ by a few fp32 ulps (exp2 with a folded scale, a contracted
# s * scale - m), and two fp32 values that close can truncate a whole TF32 ulp apart, which is
# at most 2^-10 = 2 u_mm of p_j. Summed over the keys that moves out_i by at most
# 2 u_mm sum_j p_j |v_j| / l = 2 u_mm A_i (A = oracle.Reference.out_magnitude), added absolutely
# at max A. (Set by: triton_fa2 fp32 at 1.04x on one-hot rows, a weight read as 1 - 2^-11 where
# the reference's exp(0) = 1 stayed 1; calibration: docs/CALIBRATION.md#tf32.)
TF32_WEIGHT_ULPS = 2.0
#
# Other summation orders (split-K over key blocks, tree reductions in P @ V and in l): any order
# of n fp32 additions, the reference's included, is within (n - 1) u32 sum|terms| of the exact
# sum, and the reference's actual error is the measure K_OUT, K_LSE scale. No order-specific term:
# where the reference is exact for lack of rounding (one key: nothing to reorder), so is every
# order.


# -- Deciding the rule tier by tier -------------------------------------------------------------
# Every rule here is allowed = K * (the reference's error) + noise, the reference's error >= 0:
# an error within the noise alone passes whatever the reference's error is, so the judge asks for
# the same-precision reference (oracle.same_precision_reference, a second attention) only above
# it. Such a pass reports the noise as its `allowed` and NaN as the reference's error;
# `margins=True` judges every bound on the whole rule (`fuzzattn explain`, calibration). The
# verdict is the same either way: the noise is at most the whole allowance, in floating point too
# (rounded sums of non-negative terms, the noise's a subset; rounding is monotonic). out_rms has
# a middle tier from the oracle alone: a reference rounded to bf16 or fp16 is no closer to the
# oracle than the oracle's own rounding to that dtype (error_statistics.out_rms_bound).


@dataclasses.dataclass(frozen=True)
class Bound:
    error: float                 # the implementation's worst |x - oracle| over finite entries
    allowed: float               # the allowance it was judged against: the noise alone when the
                                 # error is within it (and not `margins`), else the whole rule's
    reference_error: float       # the same-precision reference's worst error (NaN: not needed)
    row_errors: torch.Tensor     # (B, H, Nq) worst error per query row, for locating failures
    # |got - oracle| (NaN as inf), |reference - oracle| (None when not formed) and |oracle| in
    # float64, whole, for the error statistic of the same tensors (error_statistics.
    # out_rms_bound) to square instead of forming again; None when entries were excluded (a
    # non-finite oracle), which it judges apart.
    differences: tuple | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.error <= self.allowed


@dataclasses.dataclass(frozen=True)
class Differences:
    """A bound's tensors before their maxima are read (`differences`, then `finish`): apart, so
    that a judgement on an accelerator reads the maxima of several bounds in one transfer."""
    err: torch.Tensor            # |got - oracle|, NaN as inf; 0 where the oracle is not finite
    ref_err: torch.Tensor | None  # |reference - oracle|, the same entries left out; None until
                                  # the reference is asked for (`with_reference`)
    oracle_magnitude: torch.Tensor
    rows: torch.Tensor           # err's worst per query row: (B, H, Nq), or err itself below 4-d
    excluded: torch.Tensor | None
    oracle64: torch.Tensor | None = dataclasses.field(repr=False)   # the oracle in float64,
                                  # the excluded entries 0, while a reference is still to be
                                  # compared with it (None once ref_err is formed)

    @property
    def maximised(self) -> tuple[torch.Tensor, ...]:
        """What `finish` needs the maxima of, in its order (the worst error read from the rows'
        maxima, the same value: one pass over err fewer); the reference's error last, when
        formed."""
        if self.ref_err is None:
            return self.rows, self.oracle_magnitude
        return self.rows, self.oracle_magnitude, self.ref_err


def differences(got: torch.Tensor, reference: torch.Tensor | None,
                oracle: torch.Tensor) -> Differences:
    """The first phase of a bound: every tensor it compares, nothing read from a device. Entries
    where the oracle is not finite (lse of rows with no visible key) are left out here and
    checked exactly by the caller. `reference` None: its error is formed later, if the rule
    needs it (`with_reference`)."""
    # In place on fresh tensors where it can be: on the host each new tensor of a large case is
    # fresh pages to fault in, which cost more than the arithmetic.
    oracle64 = oracle.to(torch.float64)
    excluded = None if all_finite(oracle64) else ~torch.isfinite(oracle)
    if excluded is not None:
        oracle64 = oracle64.masked_fill(excluded, 0.0)
    # (got - oracle64: torch promotes got to float64 inside the subtraction, exactly, as .to()
    # would, without a float64 copy of it first.)
    err = (got - oracle64).abs_()
    ref_err = None if reference is None else (reference - oracle64).abs_()
    if excluded is not None:
        err.masked_fill_(excluded, 0.0)
        if ref_err is not None:
            ref_err.masked_fill_(excluded, 0.0)
    # NaN never satisfies <=, so a NaN error fails; keep it visible in the maximum too.
    err.nan_to_num_(nan=float("inf"), posinf=float("inf"))
    # |oracle| in place only on the masked copy, and only when no reference is left to compare
    # with it: unmasked, oracle64 may be the caller's tensor.
    if reference is None:
        return Differences(err, None, oracle64.abs(), _rows(err), excluded, oracle64)
    oracle_magnitude = oracle64.abs() if excluded is None else oracle64.abs_()
    return Differences(err, ref_err, oracle_magnitude, _rows(err), excluded, None)


def _rows(err: torch.Tensor) -> torch.Tensor:
    return err.amax(dim=-1) if err.dim() == 4 else err


def with_reference(d: Differences, reference: torch.Tensor) -> Differences:
    """`d` with the reference's error |reference - oracle| formed (the excluded entries 0)."""
    if d.ref_err is not None:
        return d
    ref_err = (reference - d.oracle64).abs_()
    if d.excluded is not None:
        ref_err.masked_fill_(d.excluded, 0.0)
    return dataclasses.replace(d, ref_err=ref_err, oracle64=None)


def finish(d: Differences, maximum: list[float], *, k: float, relative_noise: float,
           absolute_noise: float = 0.0, margins: bool = False) -> Bound | None:
    """The second phase of a bound: the rule, given the maxima of `d.maximised`, tier by tier
    (the section above): None when the error is above the noise and the reference's error is
    not formed yet (`with_reference`, then ask again with its maximum)."""
    worst, magnitude = maximum[:2]
    ref_worst = maximum[2] if len(maximum) > 2 else None
    whole = (d.err, d.ref_err, d.oracle_magnitude) if d.excluded is None else None
    noise = relative_noise * max(magnitude, FLOOR) + absolute_noise
    if worst <= noise and not margins:
        return Bound(worst, noise, math.nan, d.rows, whole)
    if ref_worst is None:
        return None
    allowed = k * ref_worst + relative_noise * max(magnitude, FLOOR) + absolute_noise
    return Bound(worst, allowed, ref_worst, d.rows, whole)


def all_finite(t: torch.Tensor) -> bool:
    """True when `t` (on the host) is certainly finite everywhere: one float64 sum instead of an
    isfinite mask and the masking it drives (finite sums come only from finite entries; a sum
    that overflows says False, and the caller masks as it would have). Always False off the
    host, where the read would be one more wait for the device (fuzzattn/run/runs.py)."""
    return t.device.type == "cpu" and math.isfinite(float(t.sum(dtype=torch.float64)))


def maxima(*tensors: torch.Tensor) -> list[float]:
    """The maximum of each tensor (0 for an empty one), read back in one transfer: on a GPU
    time-sliced between fuzzing processes each read is a wait (fuzzattn/run/runs.py). On the host it
    is also the fewest operations: n maxima (cast only where not float64 already), one stack
    and one read, where reading each maximum on its own was two operations a maximum."""
    live = [t.max() for t in tensors if t.numel()]
    read = iter(torch.stack([m if m.dtype == torch.float64 else m.to(torch.float64)
                             for m in live]).tolist() if live else ())
    return [next(read) if t.numel() else 0.0 for t in tensors]


def summed_for_tf32(dtype: torch.dtype, oracle, out_magnitude, fp32_matmul: str) -> torch.Tensor | None:
    """What out's TF32 term is the maximum of (out_magnitude, or |oracle out| without it), for a
    TF32 implementation; else None (`out_finish`'s `summed_max` is then unused)."""
    if not reads_tf32(dtype, fp32_matmul):
        return None
    summed = oracle.abs() if out_magnitude is None else out_magnitude
    return summed.to(torch.float64).nan_to_num(0.0)


def _out_noise_terms(dtype, score_magnitude: float, fp32_matmul: str, summed_max: float):
    """The out rule's noise as (relative to max(max|oracle|, FLOOR), absolute)."""
    tf32 = reads_tf32(dtype, fp32_matmul)
    return (EPS_ULPS * unit_roundoff(dtype) + NORM_ULPS * ULP32 + SCORE_ULPS * U32 * score_magnitude,
            TF32_WEIGHT_ULPS * TF32_ROUNDOFF * summed_max if tf32 else 0.0)


def out_noise(dtype, score_magnitude: float, magnitude_max: float, fp32_matmul: str = "ieee",
              summed_max: float = 0.0) -> float:
    """What one element may be off where the reference is exact (out_rms's one-element floor)."""
    relative, absolute = _out_noise_terms(dtype, score_magnitude, fp32_matmul, summed_max)
    return relative * max(magnitude_max, FLOOR) + absolute


def out_finish(d: Differences, maximum: list[float], dtype: torch.dtype, score_magnitude: float,
               fp32_matmul: str = "ieee", summed_max: float = 0.0, *,
               margins: bool = False) -> Bound | None:
    """The out rule on `d` (`differences`), given its maxima and the largest of
    `summed_for_tf32` (read together by the caller: one wait on an accelerator); None as
    `finish`."""
    relative, absolute = _out_noise_terms(dtype, score_magnitude, fp32_matmul, summed_max)
    return finish(d, maximum, k=K_OUT, relative_noise=relative, absolute_noise=absolute,
                  margins=margins)


def lse_finish(d: Differences, maximum: list[float], score_magnitude: float, *,
               margins: bool = False) -> Bound | None:
    """The lse rule on `d`, given its maxima; None as `finish`."""
    return finish(d, maximum, k=K_LSE, relative_noise=EPS_LSE_ULPS * U32,
                  absolute_noise=SCORE_ULPS * U32 * score_magnitude, margins=margins)


def out_bound(got, reference, oracle, score_magnitude: float = 0.0, *,
              out_magnitude: torch.Tensor | None = None, fp32_matmul: str = "ieee",
              margins: bool = False) -> Bound:
    """The out rule on one output, its maxima read here (`reference`: a tensor)."""
    d = differences(got, reference, oracle)
    summed = summed_for_tf32(got.dtype, oracle, out_magnitude, fp32_matmul)
    read = maxima(*d.maximised, *([] if summed is None else [summed]))
    return out_finish(d, read[:3], got.dtype, score_magnitude, fp32_matmul,
                      read[3] if summed is not None else 0.0, margins=margins)


def lse_bound(got, reference, oracle, score_magnitude: float = 0.0, *,
              margins: bool = False) -> Bound:
    d = differences(got, reference, oracle)
    return lse_finish(d, maxima(*d.maximised), score_magnitude, margins=margins)


def grad_noise(dtype: torch.dtype, fp32_matmul: str, score_magnitude: float, terms: int) -> tuple[float, float, float]:
    """The gradient rule's coefficients of (T, T_delta, T_mag) (module docstring)."""
    u_mm = TF32_ROUNDOFF if reads_tf32(dtype, fp32_matmul) else 0.0
    u_op = max(unit_roundoff(dtype), u_mm)
    # A backward recomputes P = exp(s - lse) from scores and an lse computed apart (the forward's):
    # each is off by up to SCORE_ULPS u32 S, so P is off by a factor of up to e^(+-2 d), d that
    # bound, not by 1 + 2d. Linear while d is small (normal values: d ~ 1e-5); past u32 S ~ 1/8
    # (scores beyond ~1e7) no fp32 recomputation can say anything about its P, and the
    # allowance grows without bound accordingly (set by: SDPA's CPU FLASH backward off by up to
    # e^23 on values=below_sentinel, where MATH, saving P, agrees with the oracle). Past
    # RECOMPUTE_LIMIT, P may be off by more than fp32 holds (inf, or inf - inf = NaN, from a
    # correct backward): the rule says nothing, an infinite allowance.
    exponent = 2 * SCORE_ULPS * U32 * score_magnitude
    recompute = math.inf if exponent > RECOMPUTE_LIMIT else math.expm1(exponent)
    return (GRAD_EPS_ULPS * u_op, u_op, recompute + (terms + GRAD_EXTRA_OPS) * U32)


def grad_finish(d: Differences, maximum: list[float], allowance: float, *,
                margins: bool = False) -> Bound | None:
    """The gradient rule on one gradient's `d` (dq, dk or dv), given its maxima, `allowance` its
    noise term (grad_allowance); row_errors are per query row (dq) or key row (dk, dv). None as
    `finish`."""
    return finish(d, maximum, k=K_GRAD, relative_noise=0.0, absolute_noise=allowance,
                  margins=margins)


def grad_allowance(dtype: torch.dtype, terms, *, fp32_matmul: str = "ieee",
                   score_magnitude: float = 0.0, terms_summed: int = 0) -> float:
    """The gradient rule's noise term (before K_GRAD times the reference's error). When it is
    past the dtype's largest finite value, the rule says nothing: a backward that recomputes P
    from fp32 scores this large may overflow to inf (or inf - inf = NaN) and still be correct."""
    coeffs = grad_noise(dtype, fp32_matmul, score_magnitude, terms_summed)
    # (A term of magnitude 0 adds nothing, whatever its coefficient: no inf * 0.)
    return sum(c * m for c, m in zip(coeffs, maxima(terms.actual, terms.delta, terms.magnitude))
               if m)


# -- error statistics (error_statistics.py: the `out_rms` check) --------------------------------
# The max rule above bounds the worst element; this section bounds the rms of the output's error
# over the whole tensor (n elements, rows with no visible key left out):
#     allowed = K_RMS c(n) rms|ref - oracle|
#               + EPS_ULPS rms(u(dtype) |oracle| + u(fp32) A) / sqrt(n)
#               + SCORE_ULPS u(fp32) S rms(A + |oracle|)         (n = 1: at least the max rule's)
# with A = sum_j p_j |v_j| / l per element (oracle.Reference.out_magnitude), c(n) below.
# - K_RMS = 1.2. A correct kernel's output error is the final rounding R to the output dtype
#   (shared with the reference: both round nearly the same fp32 value) plus pre-rounding noise of
#   the reference's own kind (P rounded to the input dtype, fp32 sums in another order), of rms P
#   in the reference. Independent errors add in variance, so with R ~ P a kernel carrying up to
#   twice the reference's P variance (P rounded at another point of the online softmax) has ratio
#   sqrt((R^2 + 2 P^2) / (R^2 + P^2)) = sqrt(3/2) ~ 1.22: the most noise of the reference's kind a
#   correct kernel adds. One more rounding of the output per key block (a low-precision
#   accumulator) adds about R^2 / 2 per block: 1.3-3x on multi-block cases, what this rule is for.
# - c(n) = sampling.rms_sampling(n, RMS_FALSE_POSITIVE_RATE): how far two rms of n elements stray
#   apart by chance (sampling.py). Set by: CPU FLASH sdpa fp16 7x its reference on one element.
# - One element (D = 1, one visible row): its rms is the error the max rule judged, so at least
#   the max rule's allowance; the rms rule claims more than it from about 16 elements (sampling.py).
# - The one-element term: one element EPS_ULPS roundings off where the reference is right, spread
#   over n (the rms of an error in one element). An element rounds at two scales: the output
#   dtype's rounding at |out| (a final rounding that fell the other way: at most one ulp, <= 2 u
#   |out|), and the fp32 sum of the terms p_j v_j, whose rounding is relative to their size A,
#   not to the result, which can cancel far below it (set by: sdpa fp32 at 1.07x a 1-element
#   near_constant output with |out| alone). Not the max rule's epsilon, the worst element's scale.
K_RMS = 1.2
# - K_RMS_TF32 = sqrt(2), for fp32 kernels whose matmuls read TF32 operands: there the final
#   rounding R (to fp32) is ~2^13 times smaller than the reference's P noise (TF32 truncation of
#   P and V), so the ratio above is sqrt((R^2 + 2 P^2) / (R^2 + P^2)) -> sqrt(2), not sqrt(3/2):
#   nothing left to dilute a second P-type rounding (set by: triton_fa2 fp32, TF32, failing
#   out_rms with K_RMS on dominant_key cases; calibration: docs/CALIBRATION.md#tf32).
K_RMS_TF32 = math.sqrt(2.0)
RMS_FALSE_POSITIVE_RATE = 1e-6
