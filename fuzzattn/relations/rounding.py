"""The rounding model of the metamorphic relations: how far one run of a correct kernel may be
from exact attention of the inputs it was given, with no oracle to compare against.

Rounding model, from which every tolerance is built. One run may deviate from exact attention of
the inputs it was given by:
  score     s_ij = scale * q_i.k_j is an fp32 (or better) dot product of length D, then shifted by
            the running max: |error| <= eps_i = scale |q_i|_2 max_j |k_j|_2 ((D + 4) u32 + 2 u_mm)
            (worst-case dot-product bound, Cauchy-Schwarz, plus the scale multiply and the max
            subtraction; u_mm = 2^-10 for TF32 fp32 matmuls, whose operands are truncated, else 0),
            plus 2 u32 max|bias| under ALiBi. Scores off by <= eps move each weight by a factor in
            [e^-2eps, e^2eps], so the output by at most min(e^2eps - 1, 1) 2 max|V|.
  weights   P is rounded to the input dtype before P @ V (relative u_p: the dtype's roundoff, or
            u_mm for fp32), absolutely by eta = 2^-25 below fp16's normal range, and V as a
            matmul operand by u_mm: (u_p + u_mm + Nk eta) max|V|.
  sums      fp32 sums over Nk keys, per-tile rescales, exp and the division: (Nk + 8) u32 max|V|.
  output    rounding to the output dtype: u_out |O|.
  lse       1-Lipschitz in the scores: eps + (Nk + 8) u32 + u32 |lse|.
max|V| is per (batch, kv head), |O|, eps and lse per query row. A relation's tolerance sums these
for the two runs, keeping only the terms that can differ between them (each relation says which).

The score term is needed whenever the two runs feed a kernel different vectors or positions:
scores of the same pair are not bit-identical across runs in practice (torch_tiled's lse moves by
3 ulps between batch sizes on values=large). It is a worst-case bound: eps ~ 1e-5 on normal
values keeps the checks sharp, but eps ~ 0.15 on values=large lets the out checks of
key_permutation, batch_independence and score_shift allow ~0.7 max|V| there, and on
values=below_sentinel it saturates (only the spread of V is bounded). value_shift and
causal_prefix feed identical q and k at identical positions, so for deterministic kernels their
scores are bit-identical and they have no score term; for kernels declaring
deterministic=False both runs' whole error is allowed.
"""
from __future__ import annotations

import torch

from fuzzattn.contract.alibi import max_bias
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.dtypes import TF32_TRUNCATION, U32, reads_tf32, unit_roundoff
from fuzzattn.contract.implementation import Implementation

FP16_WEIGHT_FLOOR = 2.0 ** -25   # absolute rounding of an fp16 weight below 2^-14 (subnormal)
EXTRA_OPS = 8                    # fp32 ops per row besides the Nk-term sums: exp, rescale, /l
SCORE_EXTRA_OPS = 4              # besides the D-term dot product: scale multiply, max subtraction


class Rounding:
    """The unit roundoffs of the model in the module docstring, for one implementation and case."""

    def __init__(self, impl: Implementation, case: AttentionCase):
        tf32 = reads_tf32(case.dtype, impl.caps.fp32_matmul)
        self.u_mm = TF32_TRUNCATION if tf32 else 0.0
        # fp32 weights are not rounded before P @ V, except as a TF32 operand.
        self.u_p = self.u_mm if case.dtype == "float32" else unit_roundoff(case.dtype)
        self.u_out = unit_roundoff(case.dtype)
        self.eta = FP16_WEIGHT_FLOOR if case.dtype == "float16" else 0.0
        self.nk = case.seq_k
        self.head_dim = case.head_dim
        self.scale = abs(case.softmax_scale)
        # An ALiBi bias is one more fp32 term of each score: its product slope * distance and
        # its addition each round by up to u32 of the largest |bias|.
        self.bias_error = 2 * U32 * max_bias(case.alibi, case.heads, case.seq_q, case.seq_k)

    @property
    def reduction(self) -> float:
        """Relative error of the fp32 sums over keys (with rescales, exp and the division)."""
        return (self.nk + EXTRA_OPS) * U32

    def weights_and_sums(self, v_max: torch.Tensor) -> torch.Tensor:
        """One run's error from rounding P (and V as a matmul operand) and from the fp32 sums."""
        return (self.u_p + self.u_mm + self.nk * self.eta + self.reduction) * v_max

    def score_error(self, q: torch.Tensor, k: torch.Tensor, group: int) -> torch.Tensor:
        """(B, Hq, Nq) bound eps_i on the score error of row i, over all keys of its kv head.

        sum_d |q_id k_jd| <= |q_i|_2 |k_j|_2 (Cauchy-Schwarz) keeps this O((Nq + Nk) D): no
        Nq x Nk matrix is formed, so the bound costs nothing at oracle-free sizes."""
        q_norm = q.to(torch.float64).norm(dim=-1)                               # (B, Hq, Nq)
        if k.shape[2] == 0:
            return torch.zeros_like(q_norm)
        k_norm = k.to(torch.float64).norm(dim=-1).amax(dim=-1)                   # (B, Hkv)
        k_norm = k_norm.repeat_interleave(group, dim=1)[..., None]               # (B, Hq, 1)
        per_product = (self.head_dim + SCORE_EXTRA_OPS) * U32 + 2 * self.u_mm
        return self.scale * per_product * q_norm * k_norm + self.bias_error

    def score_term(self, eps: torch.Tensor, v_max: torch.Tensor) -> torch.Tensor:
        """Output error from scores off by at most eps: the weights move by e^(+-2 eps)."""
        return torch.clamp(torch.expm1(2 * eps), max=1.0) * 2 * v_max

    def rerun(self, eps: torch.Tensor, v_max: torch.Tensor) -> torch.Tensor:
        """One run's whole error, output rounding aside: scores, weights and sums."""
        return self.score_term(eps, v_max) + self.weights_and_sums(v_max)


def max_abs_v(v: torch.Tensor, group: int) -> torch.Tensor:
    """(B, Hq, 1): max|v| over the keys of each query head's kv head."""
    if v.shape[2] == 0:
        return torch.zeros(v.shape[0], v.shape[1] * group, 1, dtype=torch.float64, device=v.device)
    m = v.to(torch.float64).abs().amax(dim=(-2, -1))
    return m.repeat_interleave(group, dim=1)[..., None]


def finite_abs(t: torch.Tensor) -> torch.Tensor:
    """|t| in float64, with NaN and inf read as 0: a tolerance must stay finite, so that a NaN
    or a -inf where a finite value belongs (error inf) can never be within it."""
    t = t.to(torch.float64)
    return torch.where(torch.isfinite(t), t.abs(), torch.zeros_like(t))


def row_abs(out: torch.Tensor) -> torch.Tensor:
    """(B, H, Nq): max|O| of each row, finite entries only."""
    return finite_abs(out).amax(dim=-1)
