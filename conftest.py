"""Project-wide pytest setup: the Hypothesis profiles.

Profiles (fuzzattn/profiles.py holds their numbers):
  ci       deterministic (derandomize, no database), 200 cases per test, shapes that fit a 2-core
           CPU under Triton's interpreter. Registered on top of Hypothesis's own built-in "ci"
           profile, which Hypothesis loads by itself when CI=true: we keep its settings and add
           our budget, then load ours explicitly.
  dev      random, 100 cases per test, the same small shapes: quick local feedback
  gpu      1000 cases per test, sequences up to ~1k: compiled kernels on a GPU
  nightly  5000 cases per test, sequences up to ~2k
Choose with --fuzzattn-profile NAME (or FUZZATTN_PROFILE=NAME); default: ci when CI is set, gpu
when CUDA is available, dev otherwise. The fuzzattn plugin loads it in pytest_configure.
"""
from fuzzattn import profiles

pytest_plugins = ["pytester"]   # the plugin and fixture-replay tests drive pytest itself

# Registering here (at conftest import, before any plugin's pytest_configure) makes the names
# valid for --hypothesis-profile too.
profiles.register_hypothesis_profiles()
