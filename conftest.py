"""This repository's pytest set-up: it opts in to the fuzzattn plugin (installing fuzzattn does
not; see fuzzattn/pytest_plugin.py), and uses pytester for the plugin's own tests.

Profiles (fuzzattn/contract/profiles.py holds their numbers): ci (deterministic, 200 cases per
test, CPU-interpreter shapes), dev (random, 100), gpu (1000, sequences to ~1k), nightly (5000).
Choose with --fuzzattn-profile NAME (or FUZZATTN_PROFILE=NAME); default: ci when CI is set, gpu
when CUDA is available, dev otherwise.
"""
pytest_plugins = ["pytester", "fuzzattn.pytest_plugin"]

import os
from pathlib import Path

# Subprocesses the suite starts (pytester's runpytest_subprocess, `python -m fuzzattn.cli`) must
# import this checkout, not whichever fuzzattn is installed in the environment (an editable
# install of another worktree): they run from temporary directories, where the current directory
# no longer puts this checkout first on sys.path.
_ROOT = str(Path(__file__).resolve().parent)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _ROOT])
