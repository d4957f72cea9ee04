"""This repository's pytest set-up: it opts in to the fuzzattn plugin (installing fuzzattn does
not; see fuzzattn/pytest_plugin.py), and uses pytester for the plugin's own tests.

Profiles (fuzzattn/contract/profiles.py holds their numbers): ci (deterministic, 200 cases per
test, CPU-interpreter shapes), dev (random, 100), gpu (1000, sequences to ~1k), nightly (5000).
Choose with --fuzzattn-profile NAME (or FUZZATTN_PROFILE=NAME). This suite's default is ci when
CI is set and dev everywhere else, a CUDA host included: its tests check the engine and the
kernels on the same sizes on every machine, while the gpu profile's 1,000-case campaigns with
sequences to ~1k are what `fuzzattn fuzz` and `fuzzattn gate` run there (under it, single engine
tests that fuzz and shrink took minutes each on an H200).
"""
pytest_plugins = ["pytester", "fuzzattn.pytest_plugin"]

import os
from pathlib import Path

if not os.environ.get("FUZZATTN_PROFILE") and not os.environ.get("CI"):
    os.environ["FUZZATTN_PROFILE"] = "dev"

# Subprocesses the suite starts (pytester's runpytest_subprocess, `python -m fuzzattn.cli`) must
# import this checkout, not whichever fuzzattn is installed in the environment (an editable
# install of another worktree): they run from temporary directories, where the current directory
# no longer puts this checkout first on sys.path.
_ROOT = str(Path(__file__).resolve().parent)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _ROOT])


# Longest first. pytest-xdist hands tests to workers in collection order, and the interpreted
# Triton campaigns (~50 s each on the 2-core CI machine, tests/test_differential.py and
# tests/test_gradients.py) were collected mid-way: the last of them often ran alone at the end
# while the other worker sat idle. Started first, they overlap with everything else.
_LONG = ("test_differential.py::test_matches_oracle", "test_gradients.py::test_gradients_match_oracle")


def pytest_collection_modifyitems(items):
    def long_running(item) -> bool:
        return "triton_fa2" in item.nodeid and any(part in item.nodeid for part in _LONG)

    items.sort(key=lambda item: 0 if long_running(item) else 1)     # stable: the rest keep order
