"""fuzzattn: differential fuzz testing for attention kernels.

The public API a user's own Hypothesis test needs:

    from hypothesis import given
    from fuzzattn import AttentionCase, Capabilities, Implementation, attention_cases, check_case, refuse

The walk of one case, one subpackage a step (tests/meta/test_layers.py keeps the imports pointing
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
# is chosen before anything else in the package, or a user's code, can import triton. Without
# a GPU in sight that costs no torch import (select_backend).
from fuzzattn.triton_interpreter.backend import select_backend

select_backend()

# The public API is imported on first use (PEP 562): `import fuzzattn` alone, as every command
# line and worker process does first, stays free of torch and Hypothesis (`fuzzattn --help`).
__all__ = ["AttentionCase", "Capabilities", "Counterexample", "Implementation", "JudgedCase",
           "KnownDefect", "UnsupportedCaseError", "Verdict", "attention_cases", "check_case",
           "judge", "refuse", "__version__"]


def __getattr__(name: str):
    if name in ("AttentionCase", "Capabilities", "Implementation", "KnownDefect",
                "UnsupportedCaseError", "refuse"):
        from fuzzattn import contract as home
    elif name in ("Counterexample", "check_case"):
        from fuzzattn.campaigns import campaign as home
    elif name in ("JudgedCase", "judge"):
        from fuzzattn.judgement import judge as home
    elif name == "Verdict":
        from fuzzattn.judging import verdict as home
    elif name == "attention_cases":
        from fuzzattn import strategies as home
    elif name == "__version__":
        value = globals()[name] = _version()
        return value
    else:
        raise AttributeError(f"module 'fuzzattn' has no attribute {name!r}")
    value = globals()[name] = getattr(home, name)      # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("fuzzattn")
    except PackageNotFoundError:         # imported from a checkout that was never installed
        return "0+unknown"
