"""The window and softcap of the Triton FlashAttention-2 kernels, shared by forward and backward.

Masks as two edges. Causal attention and a sliding window both keep key j for query i inside

    i + LEFT_SHIFT <= j <= i + CAUSAL_SHIFT

so the kernels need two shifts, not four flags. The upper edge is the nearer of causal's
diagonal (shift 0 top-left, Nk - Nq bottom-right) and the window's right edge (Nk - Nq + right;
the window is bottom-right aligned whatever causal's alignment, as FlashAttention's); the lower
edge is the window's left edge, Nk - Nq - left. An unbounded side (-1) is no edge at all. One
upper shift lets the kernels' causal block skipping serve the window's right edge unchanged.

Softcap: x -> c * tanh(x / c) on the scaled score x, before any mask. Triton's interpreter has no
libdevice, so tanh is computed here from exp, accurately enough that the cap adds no more than a
few ulps of the capped score: Cephes' tanhf (an odd polynomial for |y| < 0.625, where
1 - 2 / (e^2y + 1) would cancel, and that form beyond).
"""
from __future__ import annotations

import triton
import triton.language as tl

from fuzzattn.triton_interpreter.backend import ensure_backend

ensure_backend()      # before @triton.jit below, which reads TRITON_INTERPRET when it runs


def sequence_edges(causal: str, window: tuple[int, int]):
    """The kept band before the lengths are known: (upper edge from the top, upper edge from the
    diagonal Nk - Nq, lower edge from the diagonal), None for no edge. A packed kernel applies
    them per sequence; `mask_edges` to one pair of lengths."""
    left, right = window
    top = 0 if causal == "top_left" else None
    from_diagonal = ([0] if causal == "bottom_right" else []) + ([right] if right >= 0 else [])
    return top, min(from_diagonal) if from_diagonal else None, -left if left >= 0 else None


def mask_edges(causal: str, window: tuple[int, int], seq_q: int, seq_k: int):
    """(upper, lower) shifts of the kept band i + lower <= j <= i + upper; None for no edge."""
    top, upper_diagonal, lower_diagonal = sequence_edges(causal, window)
    diagonal = seq_k - seq_q
    uppers = [e for e in (top, None if upper_diagonal is None else diagonal + upper_diagonal)
              if e is not None]
    upper = min(uppers) if uppers else None
    lower = None if lower_diagonal is None else diagonal + lower_diagonal
    return upper, lower


@triton.jit
def tanh(y):
    """tanh of an fp32 tile, odd and within a few ulps; NaN stays NaN, +-inf give +-1."""
    a = tl.abs(y)
    z = a * a
    small = ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z
              + 1.33314422036e-1) * z - 3.33332819422e-1) * z * a + a
    # tanh(20) is 1 in fp32: the clamp keeps exp finite (NaN still propagates).
    large = 1.0 - 2.0 / (tl.exp(2.0 * tl.minimum(a, 20.0, propagate_nan=tl.PropagateNan.ALL)) + 1.0)
    t = tl.where(a < 0.625, small, large)
    return tl.where(y < 0, -t, t)
