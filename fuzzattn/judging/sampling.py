"""How far the ratio of two rms errors over n elements strays by chance: the out_rms rule's
sampling factor (error_statistics.py, constants in tolerance.py).

Model: a correct kernel's errors and the reference's are n independent draws each of zero-mean
Gaussian noise of the same variance (their roundings differ in where they fall, not in size). The
ratio of their rms is then sqrt(F) with F ~ F(n, n), Snedecor's distribution with n and n degrees
of freedom, and `rms_sampling(n, alpha)` is the ratio exceeded with probability `alpha`.

It is heavy-tailed for small n and concentrates as n grows: at n = 1 the ratio of two single
errors is the absolute value of a Cauchy variable (P(ratio > 3.6) = 17%), so one element says
nothing about whether a kernel carries more noise than its reference; at n = 1024 the ratio stays
within 1.16 but for one draw in a million. Shared components of the two errors (the final
rounding to the output dtype, where both round nearly the same fp32 value) only narrow the
ratio, so the model is the worst case of a correct kernel. The rms rule claims more than the
max rule once K_RMS c(n) falls below K_OUT times a reference's worst-to-rms ratio (~2.5 for
Gaussian-like errors): from about 16 elements (c(16) = 3.9); below that it adds little, and on
one element the rule allows at least the max rule's allowance (tolerance.py).

F(n, n) is symmetric Beta's transform: F = B / (1 - B), B ~ Beta(n/2, n/2), so the quantile comes
from the regularized incomplete beta function (Lentz's continued fraction; Numerical Recipes,
2nd ed., 6.4) inverted by bisection. Past EXACT_UP_TO elements the log-normal limit (ln F has
variance 4/n) is used: it agrees with the exact quantile to 4 significant digits there.
"""
from __future__ import annotations

import functools
import math
import statistics

EXACT_UP_TO = 4096


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function I_x(a, b) (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta did not converge for a={a}, b={b}, x={x}")


def _symmetric_beta_upper_tail(a: float, x: float) -> float:
    """P(B > x) for B ~ Beta(a, a) and x >= 1/2: I_{1-x}(a, a), by symmetry."""
    y = 1.0 - x
    if y <= 0.0:
        return 0.0
    log_front = (math.lgamma(2 * a) - 2 * math.lgamma(a) + a * math.log(y) + a * math.log1p(-y))
    return math.exp(log_front) * _continued_fraction(a, a, y) / a


@functools.lru_cache(maxsize=4096)
def rms_sampling(n: int, alpha: float) -> float:
    """The ratio of two independent rms over `n` Gaussian errors of equal variance that is
    exceeded with probability `alpha` (module docstring); 1 for n = 0."""
    if n <= 0:
        return 1.0
    if n > EXACT_UP_TO:
        return math.exp(statistics.NormalDist().inv_cdf(1.0 - alpha) / math.sqrt(n))
    a, lo, hi = n / 2.0, 0.5, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _symmetric_beta_upper_tail(a, mid) > alpha:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    b = 0.5 * (lo + hi)
    return math.sqrt(b / (1.0 - b))
