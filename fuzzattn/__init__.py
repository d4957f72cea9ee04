"""fuzzattn: differential fuzz testing for attention kernels.

The public API a user's own Hypothesis test needs:

    from hypothesis import given
    from fuzzattn import AttentionCase, Capabilities, Implementation, attention_cases, check_case, refuse

The walk of one case, one subpackage a step (tests/test_layers.py keeps the imports pointing
down this list, and free of cycles):

    contract/            plain data: AttentionCase, dtypes, Capabilities, Implementation, profiles
    platform/            process and device tuning, the versions a case ran with
    triton_interpreter/  backend selection and the fenced repairs of Triton's interpreter
    inputs/              a case becomes tensors
    run/                 finding and calling an implementation under test
    judging/             the float64 oracle, the tolerance rule, the checks, the verdicts
    gradients/           dq, dk, dv judged the same way
    relations/           oracle-free metamorphic relations
    isolation/           judging in supervised worker processes
    campaigns/           campaigns, regression files, replay, outcomes
    cli/, pytest_plugin, settings   the command line and the pytest plugin

fuzzattn.strategies (Hypothesis strategies, from the repository's strategies/) depends only on
the contract; fuzzattn.kernels (kernels/: the implementations under test) registers itself through
an entry point and never imports the oracle.
"""
# Triton fixes its backend when first imported, so the interpreter (on machines without a GPU)
# is chosen before anything else in the package, or a user's code, can import triton.
from importlib.metadata import PackageNotFoundError, version

from fuzzattn.triton_interpreter.backend import select_backend

select_backend()

# isort: split
from fuzzattn.contract import (AttentionCase, Capabilities, Implementation, KnownDefect,
                               UnsupportedCaseError, refuse)
from fuzzattn.campaigns.campaign import Counterexample, check_case
from fuzzattn.judgement.judge import JudgedCase, judge
from fuzzattn.judging.verdict import Verdict
from fuzzattn.strategies import attention_cases
from fuzzattn.campaigns import hypothesis_internals

hypothesis_internals.install()
# pytest's one-line summary of a failure starts with the exception's module path: the public one
Counterexample.__module__ = __name__

try:
    __version__ = version("fuzzattn")
except PackageNotFoundError:         # imported from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["AttentionCase", "Capabilities", "Counterexample", "Implementation", "JudgedCase",
           "KnownDefect", "UnsupportedCaseError", "Verdict", "attention_cases", "check_case",
           "judge", "refuse", "__version__"]
