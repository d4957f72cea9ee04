"""Value profiles: how q, k, v are filled (the values themselves come from the case's seed)."""
from __future__ import annotations

from hypothesis import strategies as st

from fuzzattn.contract.case import VALUE_PROFILES

# Simple to exotic, so that shrinking moves toward standard-normal values; then exact_mean, the
# simplest values of all (q = 0, v constant along the keys), then the rest as declared.
ORDER = ("normal", "exact_mean") + tuple(p for p in VALUE_PROFILES
                                         if p not in ("normal", "exact_mean"))
# bf16 and fp16 cases draw exact_mean three times as often (3 in 10): rounding is the bug class
# only those dtypes add, and one rounding too many per key block shows on exact_mean at several
# times its bound where other values put it at 1.0-1.4x (so a campaign that met other values
# first caught it by a hair; measured on the precision mutants over 10 campaign seeds).
LOW_PRECISION_EXTRA = ("exact_mean", "exact_mean")


def value_profiles(dtype: str | None = None) -> st.SearchStrategy[str]:
    """A profile name for a case of `dtype` (None: any), shrinking toward "normal"."""
    extra = LOW_PRECISION_EXTRA if dtype in ("bfloat16", "float16") else ()
    return st.sampled_from(ORDER + extra)
