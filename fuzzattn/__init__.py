"""fuzzattn: differential fuzz testing for attention kernels.

The public API a user's own Hypothesis test needs:

    from hypothesis import given
    from fuzzattn import AttentionCase, Capabilities, Implementation, attention_cases, check_case, refuse

Layers, each importing only the ones below it (tests/test_layers.py checks this):

    contract/   plain data: AttentionCase, dtypes, Capabilities, Implementation, profiles
    engine/     materialise, run, oracle, tolerance, checks, verdicts, registry, loader
    campaigns/  campaigns, regression files, replay, outcomes
    cli/, pytest_plugin, settings   the command line and the pytest plugin, sharing run settings

`strategies/` (Hypothesis strategies) depends only on the contract; `kernels/` (the
implementations under test) registers itself through an entry point and never imports the oracle.
"""
# Triton fixes its backend when first imported, so the interpreter (on machines without a GPU)
# is chosen before anything else in the package, or a user's code, can import triton.
from fuzzattn.engine.triton_backend import select_backend

select_backend()

# isort: split
from fuzzattn.contract import (AttentionCase, Capabilities, Implementation, KnownDefect,
                               UnsupportedCaseError, refuse)
from fuzzattn.campaigns.campaign import Counterexample, check_case
from fuzzattn.engine.judge import JudgedCase, judge
from fuzzattn.engine.verdict import Verdict
from strategies import attention_cases

__version__ = "0.2.0"

__all__ = ["AttentionCase", "Capabilities", "Counterexample", "Implementation", "JudgedCase",
           "KnownDefect", "UnsupportedCaseError", "Verdict", "attention_cases", "check_case",
           "judge", "refuse", "__version__"]
