"""Hypothesis strategies that draw attention cases from what an implementation declares."""
from .cases import attention_cases, undeclared_cases
from .layouts import layouts
from .lengths import head_dims, seq_lens
from .values import value_profiles

__all__ = ["attention_cases", "undeclared_cases", "head_dims", "layouts", "seq_lens",
           "value_profiles"]
