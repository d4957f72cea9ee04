"""ALiBi slopes: a case names a slope family, and each query head's slope follows from it.

FlashAttention's `alibi_slopes` are one float32 slope per query head; the bias
-slope_h * |i + Nk - Nq - j| is added to the scaled (and softcapped) score of query i and key j,
before the mask. A case records a family's name rather than Hq floats, so a regression file stays
one readable field and a strategy draws a choice, not floats that shrink to noise. The slopes are
rounded to float32 here, once: a kernel is given them so, and the references read the same values.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# The ALiBi paper's geometric slopes 2^(-8 (h + 1) / H), for any H (for H not a power of two the
# paper interleaves two such sequences; one sequence keeps every head's slope distinct).
STANDARD = "standard"
FAMILIES = {
    STANDARD: lambda h, heads: 2.0 ** (-8.0 * (h + 1) / heads),
    # Four times those: slopes up to 2, so keys tens of positions away weigh nothing.
    "scaled": lambda h, heads: 4.0 * 2.0 ** (-8.0 * (h + 1) / heads),
    # 1 to 8 across the heads: only the few keys nearest the diagonal keep any weight.
    "steep": lambda h, heads: 1.0 + 7.0 * h / max(heads - 1, 1),
    # The standard slopes / 1024: biases near the scores' own rounding, a bug's signal small.
    "tiny": lambda h, heads: 2.0 ** (-8.0 * (h + 1) / heads - 10),
}


def alibi_slopes(family: str, heads: int, device=None) -> torch.Tensor:
    """(heads,) float32: each query head's slope in `family` (AttentionCase.alibi)."""
    if family not in FAMILIES:
        raise ValueError(f"alibi={family!r} is not a slope family (known: {', '.join(FAMILIES)})")
    import torch          # here: a case names its family without torch (the command line's tables)
    return torch.tensor([FAMILIES[family](h, heads) for h in range(heads)], dtype=torch.float32,
                        device=device)


def alibi_bias(slopes: torch.Tensor, seq_q: int, seq_k: int, dtype: torch.dtype) -> torch.Tensor:
    """(H, Nq, Nk) in `dtype`: -slope_h * |i + Nk - Nq - j|, the distance from the bottom-right
    diagonal, as FlashAttention defines it (computed in `dtype` from the float32 slopes)."""
    import torch
    i = torch.arange(seq_q, device=slopes.device, dtype=dtype)[:, None]
    j = torch.arange(seq_k, device=slopes.device, dtype=dtype)[None, :]
    distance = (i + (seq_k - seq_q) - j).abs()
    return -slopes.to(dtype)[:, None, None] * distance


def max_bias(family: str, heads: int, seq_q: int, seq_k: int) -> float:
    """The largest |bias| over every (head, query, key) pair: the steepest slope times the
    farthest distance, max(Nq, Nk) - 1 (0 when off or a length is 0)."""
    if not family or seq_q == 0 or seq_k == 0:
        return 0.0
    return float(alibi_slopes(family, heads).max()) * (max(seq_q, seq_k) - 1)
