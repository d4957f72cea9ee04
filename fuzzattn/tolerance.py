"""The one tolerance rule every implementation is judged by. All constants live here.

Rule (after FlashAttention's tests, ../shared/BUGS.md): an implementation's worst error against
the float64 oracle may be at most K times the worst error of a same-precision PyTorch reference
(`oracle.same_precision_reference`) against the same oracle, plus a rounding-noise epsilon:

    allowed = K * max|ref - oracle|
              + (EPS_ULPS * u(dtype) + SCORE_ULPS * u(fp32) * max|score|) * max(|oracle|, FLOOR)

- K_OUT = 2: FlashAttention asserts forward error <= 2x its PyTorch reference's error.
- K_LSE = 2: the same rule applied to the logsumexp.
- EPS_ULPS = 2, u = unit roundoff of the output's dtype (2^-24 fp32, 2^-8 bf16, 2^-11 fp16):
  FlashAttention's epsilon is the error of rounding the reference output itself to the output
  dtype, measured as 2x that rounding on values near 0.3; two units of roundoff at the output's
  magnitude is that same quantity, computed without a probe. It keeps the bound from collapsing
  when the reference happens to be exact (tiny cases, one visible key).
- SCORE_ULPS = 4: fast kernels fold scale * log2(e) into q and use exp2, or scale q and k by
  sqrt(scale) (PyTorch's math path), so each fp32 score carries a few units of roundoff of its
  own magnitude that a reference computing (q.k) * scale does not; the softmax turns an absolute
  score error d into a relative output error of about d. Seen without this term: SDPA fp32 at
  4.8e-7 against 3.6e-7 allowed on the H200, 2.8e-7 against 2.6e-7 on the CPU.
- lse is always float32. A tiled kernel forms it as m + log(l), where l went through a rescale,
  an exp and an add per key tile and a log at the end, each worth about one unit of fp32
  roundoff relative to l, i.e. absolute on log(l); the one-pass reference does fewer. So its
  epsilon is EPS_LSE_ULPS = 8 units of fp32 roundoff at |lse|'s magnitude (seen: 4.2 units on a
  fp16 case whose reference happened to be nearly exact).
- FLOOR = 1: the magnitude below which absolute, not relative, rounding noise is the right
  scale (outputs are convex combinations of V rows drawn from N(0, 1)).
Errors are compared as float64 maxima over the whole tensor; the rows over the bound are
reported as the failure's location.
"""
from __future__ import annotations

import dataclasses

import torch

K_OUT = 2.0
K_LSE = 2.0
EPS_ULPS = 2.0
EPS_LSE_ULPS = 8.0
SCORE_ULPS = 4.0
FLOOR = 1.0
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11,
                 torch.float64: 2.0 ** -53}


@dataclasses.dataclass(frozen=True)
class Bound:
    error: float                 # the implementation's worst |x - oracle| over finite entries
    allowed: float
    reference_error: float       # the same-precision reference's worst error
    row_errors: torch.Tensor     # (B, H, Nq) worst error per query row, for locating failures

    @property
    def ok(self) -> bool:
        return self.error <= self.allowed


def _max(t: torch.Tensor) -> float:
    return float(t.max()) if t.numel() else 0.0


def bound(got: torch.Tensor, reference: torch.Tensor, oracle: torch.Tensor, *, k: float,
          noise: float) -> Bound:
    """Judge `got` against `oracle` by the rule above; entries where the oracle is not finite
    (lse of rows with no visible key) are excluded here and checked exactly by the caller."""
    finite = torch.isfinite(oracle)
    oracle64 = torch.where(finite, oracle, torch.zeros_like(oracle))
    err = (got.to(torch.float64) - oracle64).abs().masked_fill(~finite, 0.0)
    ref_err = (reference.to(torch.float64) - oracle64).abs().masked_fill(~finite, 0.0)
    # NaN never satisfies <=, so a NaN error fails; keep it visible in the maximum too.
    err = torch.where(torch.isnan(err), torch.full_like(err, float("inf")), err)
    scale = max(_max(oracle64.abs()), FLOOR)
    allowed = k * _max(ref_err) + noise * scale
    rows = err.amax(dim=-1) if err.dim() == 4 else err
    return Bound(_max(err), allowed, _max(ref_err), rows)


def out_bound(got, reference, oracle, score_max: float = 0.0) -> Bound:
    noise = EPS_ULPS * UNIT_ROUNDOFF[got.dtype] + SCORE_ULPS * UNIT_ROUNDOFF[torch.float32] * score_max
    return bound(got, reference, oracle, k=K_OUT, noise=noise)


def lse_bound(got, reference, oracle, score_max: float = 0.0) -> Bound:
    # |lse| >= the row's largest score, so the relative epsilon already scales with the scores
    return bound(got, reference, oracle, k=K_LSE, noise=EPS_LSE_ULPS * UNIT_ROUNDOFF[torch.float32])
