"""The differential property: every registered implementation agrees with the float64 oracle.

One Hypothesis test per (implementation, dtype) it declares, drawing only what it declares.
A failure is shrunk, written to regressions/ as a fixture, and reported with its replay command.
These judge the forward only (gradients=False), at the profile's full budget; gradients have
their own property with smaller budgets (tests/test_gradients.py), since a Triton backward under
the interpreter costs several forwards.
"""
import pytest
from hypothesis import given, strategies as st

from fuzzattn.campaigns.campaign import check_case
from fuzzattn.contract.case import DTYPES
from fuzzattn.engine.judge import skip_reason
from fuzzattn.settings import implementations as all_implementations
from strategies import attention_cases

PARAMS = [pytest.param(impl, dtype, id=f"{impl.name}-{dtype}")
          for impl in all_implementations() for dtype in DTYPES if dtype in impl.caps.dtypes]


@pytest.mark.parametrize("impl,dtype", PARAMS)
@given(data=st.data())
def test_matches_oracle(impl, dtype, data):
    case = data.draw(attention_cases(impl.caps, dtype=dtype), label="case")
    reason = skip_reason(impl, case)
    if reason is not None:
        pytest.skip(reason)   # e.g. bf16 under an interpreter whose dot cannot be repaired
    check_case(impl, case, gradients=False)
