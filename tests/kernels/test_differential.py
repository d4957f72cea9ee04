"""The differential property: every registered implementation agrees with the float64 oracle.

One Hypothesis test per (implementation, dtype) it declares, drawing only what it declares.
A failure is shrunk, written to regressions/ as a regression file, and reported with its replay
command. With `--fuzzattn-shards N` each campaign is N tests (`test_matches_oracle_shard<i>`),
each with its own Hypothesis seed and 1/N of the budget, so `pytest -n N` spreads one
implementation's campaign over N workers instead of running it on one.
These judge the forward only (gradients=False), at the profile's full budget; gradients have
their own property with smaller budgets (tests/gradients/test_gradients.py), since a Triton backward under
the interpreter costs several forwards.
"""
import pytest
from hypothesis import given, seed, settings, strategies as st

from fuzzattn import settings as run_settings
from fuzzattn.campaigns.campaign import check_case
from fuzzattn.contract.case import DTYPES
from fuzzattn.judgement.judge import skip_reason
from fuzzattn.strategies import attention_cases
from fuzzattn.campaigns.compile_palette import campaign_palette

PARAMS = [pytest.param(impl, dtype, id=f"{impl.name}-{dtype}")
          for impl in run_settings.implementations() for dtype in DTYPES if dtype in impl.caps.dtypes]


def _campaign(shard: int, shards: int):
    @pytest.mark.parametrize("impl,dtype", PARAMS)
    @given(data=st.data())
    def test(impl, dtype, data):
        case = data.draw(attention_cases(impl.caps, dtype=dtype,
                                         palette=campaign_palette(impl, shard)), label="case")
        reason = skip_reason(impl, case)
        if reason is not None:
            pytest.skip(reason)   # e.g. bf16 under an interpreter whose dot cannot be repaired
        check_case(impl, case, gradients=False)

    if shards > 1:
        test = seed(shard)(settings(max_examples=-(-settings().max_examples // shards))(test))
    return test


SHARDS = run_settings.shards()
if SHARDS == 1:
    test_matches_oracle = _campaign(0, 1)
else:
    for _shard in range(SHARDS):
        globals()[f"test_matches_oracle_shard{_shard}"] = _campaign(_shard, SHARDS)
