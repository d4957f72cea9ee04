"""Value profiles: how q, k, v are filled (the values themselves come from the case's seed)."""
from __future__ import annotations

from hypothesis import strategies as st

from fuzzattn.contract.case import VALUE_PROFILES


def value_profiles() -> st.SearchStrategy[str]:
    """Simple to exotic, so that shrinking moves toward standard-normal values."""
    return st.sampled_from(VALUE_PROFILES)
