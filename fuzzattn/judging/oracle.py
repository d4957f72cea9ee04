"""Reference attention: the float64 oracle and the same-precision reference the tolerance uses.

Both compute softmax(scale * q k^T, softcapped, plus the ALiBi bias, masked) v on the *materialised*
(already rounded) inputs, so the oracle's only error is float64 rounding. Rows with no visible key
(bottom-right alignment with Nq > Nk, a window past the keys, or Nk == 0) are defined as out = 0 and
lse = -inf: the limit of an empty sum, and what FlashAttention returns. SDPA's own behaviour for
such rows is documented in kernels/sdpa.py.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from fuzzattn.contract.alibi import alibi_bias, alibi_slopes
from fuzzattn.contract import varlen
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.dtypes import reads_tf32


def visible_keys(seq_q: int, seq_k: int, causal: str, device=None,
                 window: tuple[int, int] = (-1, -1)) -> torch.Tensor | None:
    """(Nq, Nk) bool mask of the keys each query may see, or None when all are visible.

    top_left     (SDPA's is_causal):         key j visible to query i iff j <= i
    bottom_right (FlashAttention >= 2.1):    key j visible to query i iff j <= i + Nk - Nq
    window (left, right), always bottom-right aligned, -1 unbounded, and-ed with the above:
                                             i + Nk - Nq - left <= j <= i + Nk - Nq + right
    """
    left, right = window
    if causal == "none" and left < 0 and right < 0:
        return None
    i = torch.arange(seq_q, device=device)[:, None]
    j = torch.arange(seq_k, device=device)[None, :]
    seen = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    if causal != "none":
        seen &= j <= i + (0 if causal == "top_left" else seq_k - seq_q)
    diagonal = i + (seq_k - seq_q)
    if left >= 0:
        seen &= j >= diagonal - left
    if right >= 0:
        seen &= j <= diagonal + right
    return seen


def case_visible_keys(case: AttentionCase, device=None) -> torch.Tensor | None:
    """visible_keys for a whole case. A packed case's mask is block diagonal: each sequence's
    queries see its own keys only, by visible_keys of its own lengths (alignment per sequence)."""
    if not case.varlen:
        return visible_keys(case.seq_q, case.seq_k, case.causal, device, case.window)
    seen = torch.zeros(case.seq_q, case.seq_k, dtype=torch.bool, device=device)
    for q0, q1, k0, k1 in varlen.spans(case):
        block = visible_keys(q1 - q0, k1 - k0, case.causal, device, case.window)
        seen[q0:q1, k0:k1] = True if block is None else block
    return seen


def _expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    """GQA/MQA: query head h reads kv head h // (Hq // Hkv)."""
    return t.repeat_interleave(heads // t.shape[1], dim=1) if t.shape[1] != heads else t


def truncate_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> TF32 as tensor cores read it: the low 13 mantissa bits dropped (toward zero).

    Compiled Triton's tl.dot(a, I) in fp32 returns `a` with its low 13 bits cleared, i.e.
    truncation, not round-to-nearest (docs/CALIBRATION.md#tf32). Truncation is also the less
    accurate of the two, so a reference built on it bounds round-to-nearest TF32 kernels too."""
    bits = x.contiguous().view(torch.int32) & ~0x1FFF
    return torch.where(torch.isfinite(x), bits.view(torch.float32).view(x.shape), x)


@dataclasses.dataclass
class Reference:
    out: torch.Tensor        # (B, Hq, Nq, D), float64 for the oracle, the input dtype otherwise
    lse: torch.Tensor        # (B, Hq, Nq), float64 for the oracle, float32 otherwise
    empty_rows: torch.Tensor  # (Nq,) bool: rows that see no key
    some_empty: bool          # whether empty_rows has a True entry (from the lengths: no read)
    score_magnitude: float    # largest |scale| * sum_d |q_d k_d| over visible pairs: the size of
                              # the terms each fp32 score sums, which sets its rounding noise
                              # (NaN where not computed: same_precision_reference(magnitudes=False);
                              # a 0-d tensor, not yet read, from oracle(..., deferred=True))
    out_magnitude: torch.Tensor | None = None   # (B, Hq, Nq, D): sum_j p_ij |v_jd| / l_i, the
                              # size of the terms each output element sums (|out| when they do
                              # not cancel), which sets the rounding noise of that sum


@dataclasses.dataclass(frozen=True)
class Visibility:
    """Which keys each query of a case cannot see, as both references mask them: computed once
    for the pair (`visibility`), never written to."""
    hidden: torch.Tensor | None   # (Nq, Nk) bool, True where key j is hidden from query i; None
                                  # when every key is visible (and there is at least one)
    empty: torch.Tensor           # (Nq,) bool: rows that see no key
    some_empty: bool              # whether `empty` has a True entry, known from the lengths


def some_row_empty(seq_q: int, seq_k: int, causal: str,
                   window: tuple[int, int] = (-1, -1)) -> bool:
    """Whether any query row sees no key, from the lengths alone: every row when Nk = 0; with
    bottom-right alignment the first Nq - Nk rows (key j is visible to query i iff
    j <= i + Nk - Nq, so row 0 sees key 0 exactly when Nk >= Nq); never otherwise (top-left row i
    sees key 0). So a check need not read the empty-row mask back to know whether to look.
    A window keeps row i the keys [i + s - left, i + s + right] (s = Nk - Nq) within [0, Nk) and
    the causal bound: some row is empty when the first or last row's interval is (the bounds
    move by one per row, so an interval empty in the middle is empty at an end too)."""
    if seq_q == 0:
        return False
    if seq_k == 0:
        return True
    left, right = window
    shift = seq_k - seq_q
    causal_shift = {"none": None, "top_left": 0, "bottom_right": shift}[causal]
    for i in (0, seq_q - 1):
        low = 0 if left < 0 else max(0, i + shift - left)
        high = seq_k - 1
        if right >= 0:
            high = min(high, i + shift + right)
        if causal_shift is not None:
            high = min(high, i + causal_shift)
        if low > high:
            return True
    return False


def visibility(case: AttentionCase, device) -> Visibility:
    """`case`'s hidden keys and empty rows on `device`: the complement of visible_keys, with
    Nk = 0 as every row empty."""
    seq_q, seq_k = case.seq_q, case.seq_k
    if case.varlen:
        hidden = ~case_visible_keys(case, device)
        return Visibility(hidden, hidden.all(dim=-1), any(
            some_row_empty(q1 - q0, k1 - k0, case.causal, case.window)
            for q0, q1, k0, k1 in varlen.spans(case)))
    if case.causal == "none" and not case.windowed and seq_k > 0:
        # Every key visible: nothing to mask, and no row is empty; the masking in _attend is
        # skipped rather than done with an all-False mask (the same values, seven operations
        # fewer).
        return Visibility(None, torch.zeros(seq_q, dtype=torch.bool, device=device), False)
    if not case.windowed:
        # Key j is hidden from query i iff j > i + offset: the upper triangle above that
        # diagonal, built as such (two operations fewer than negating the mask and its rows' any).
        hidden = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
        if case.causal != "none":
            offset = 0 if case.causal == "top_left" else seq_k - seq_q
            hidden = hidden.triu(diagonal=offset + 1)
    else:
        hidden = ~visible_keys(seq_q, seq_k, case.causal, device, case.window)
    return Visibility(hidden, hidden.all(dim=-1),
                      some_row_empty(seq_q, seq_k, case.causal, case.window))


def _attend(q, k, v, case: AttentionCase, compute: torch.dtype, p_dtype: torch.dtype | None,
            matmul_round=None, magnitudes: bool = True, deferred: bool = False,
            out_magnitude: bool = True, seen: Visibility | None = None) -> Reference:
    q, k, v = (t.to(compute) for t in (q, k, v))
    k, v = _expand_kv(k, case.heads), _expand_kv(v, case.heads)
    if matmul_round is not None:
        q, k, v = matmul_round(q), matmul_round(k), matmul_round(v)
    # In place wherever a tensor is this function's own (fresh from a matmul, or no longer
    # needed): on the host each new float64 tensor of a larger case is fresh pages to fault in,
    # which cost as much as the arithmetic. The same operations, so the same bits.
    scores = (q @ k.transpose(-1, -2)).mul_(case.softmax_scale)
    if case.softcap:
        # Capped before the mask, so a hidden key stays -inf whatever the cap.
        scores = scores.div_(case.softcap).tanh_().mul_(case.softcap)
    bias = None
    if case.alibi:
        # After the softcap and before the mask, FlashAttention's order: a hidden key stays -inf.
        bias = alibi_bias(alibi_slopes(case.alibi, case.heads, q.device), case.seq_q, case.seq_k,
                          compute)
        scores.add_(bias)
    seen = seen or visibility(case, q.device)
    hidden, empty = seen.hidden, seen.empty
    if hidden is not None:
        scores.masked_fill_(hidden, float("-inf"))
    score_magnitude = math.nan
    if magnitudes:
        terms = q.abs() @ k.abs().transpose(-1, -2)
        unscaled = bias is None
        if not unscaled:        # the bias (<= 0) is one more term of each score's sum
            terms.mul_(abs(case.softmax_scale)).sub_(bias)
        if hidden is not None:
            terms.masked_fill_(hidden, 0.0)
        factor = abs(case.softmax_scale) if unscaled else 1.0
        score_magnitude = terms.max() * factor if terms.numel() else 0.0
        if not deferred:
            score_magnitude = float(score_magnitude)
    # A safe row maximum: rows with no visible key get 0 so exp(-inf - 0) = 0, not NaN.
    # (Every non-finite maximum to 0 in place, one operation: a fresh tensor either way.)
    row_max = scores.amax(dim=-1, keepdim=True) if case.seq_k else scores.sum(-1, keepdim=True)
    row_max.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    # The output does not depend on the shift (it cancels).
    p = scores.sub_(row_max).exp_()
    denom = p.sum(dim=-1, keepdim=True)
    if p_dtype not in (None, compute):   # the kernels' precision contract: P rounded before P @ V
        p = p.to(p_dtype).to(compute)
    if matmul_round is not None:
        p = matmul_round(p)
    safe_denom = torch.where(denom > 0, denom, 1.0)
    out = (p @ v).div_(safe_denom)
    lse = (row_max + torch.log(denom)).squeeze(-1)
    magnitude = None
    if magnitudes and out_magnitude:
        magnitude = (p @ v.abs()).div_(safe_denom)
    if hidden is not None:
        out.masked_fill_(empty[:, None], 0.0)
        if magnitude is not None:
            magnitude.masked_fill_(empty[:, None], 0.0)
    return Reference(out, lse, empty, seen.some_empty, score_magnitude, magnitude)


def oracle(q, k, v, case: AttentionCase, *, deferred: bool = False,
           seen: Visibility | None = None) -> Reference:
    """float64 attention on the rounded inputs: the ground truth. `deferred=True` leaves the
    score magnitude a 0-d tensor on the inputs' device, read back with the rest of the reference
    (judge_device.moved_together) instead of waiting for the device on its own. `seen`: the
    case's `visibility` on the inputs' device, when the caller shares it with the
    same-precision reference (by default computed here)."""
    return _attend(q, k, v, case, torch.float64, None, deferred=deferred, seen=seen)


def same_precision_reference(q, k, v, case: AttentionCase, fp32_matmul: str = "ieee", *,
                             magnitudes: bool = True, seen: Visibility | None = None) -> Reference:
    """What a careful implementation at the input precision computes (FlashAttention's rule).

    Scores and softmax state in fp32 (bf16 x bf16 products are exact there), P rounded to the
    input dtype before P @ V as FlashAttention-style kernels do, fp32 accumulation, output rounded
    to the input dtype. A TF32 implementation is judged against TF32-truncated matmul operands.
    `magnitudes=False` leaves out the score and output magnitudes (NaN and None), which the
    tolerance takes from the oracle only: two matmuls fewer for the forward's judgement.
    """
    in_dtype = q.dtype
    tf32 = truncate_to_tf32 if reads_tf32(in_dtype, fp32_matmul) else None
    ref = _attend(q, k, v, case, torch.float32, in_dtype, tf32, magnitudes=magnitudes,
                  seen=seen)
    return dataclasses.replace(ref, out=ref.out.to(in_dtype))
