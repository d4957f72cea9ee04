"""This repository's pytest set-up: it opts in to the fuzzattn plugin (installing fuzzattn does
not; see fuzzattn/pytest_plugin.py), and uses pytester for the plugin's own tests.

Profiles (fuzzattn/contract/profiles.py holds their numbers): ci (deterministic, 200 cases per
test, CPU-interpreter shapes), dev (random, 100), gpu (1000, sequences to ~1k), nightly (5000).
Choose with --fuzzattn-profile NAME (or FUZZATTN_PROFILE=NAME). This suite's default is ci when
CI is set and dev everywhere else, a CUDA host included: its tests check the engine and the
kernels on the same sizes on every machine, while the gpu profile's 1,000-case campaigns with
sequences to ~1k are what `fuzzattn fuzz` and `fuzzattn gate` run there (under it, single engine
tests that fuzz and shrink take minutes each: docs/CALIBRATION.md#suite-order).
"""
pytest_plugins = ["pytester", "fuzzattn.pytest_plugin"]

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

if not os.environ.get("FUZZATTN_PROFILE") and not os.environ.get("CI"):
    os.environ["FUZZATTN_PROFILE"] = "dev"

_ROOT = Path(__file__).resolve().parent
# What a process the suite starts from a temporary directory (pytester's runpytest_subprocess,
# `python -m fuzzattn.cli`, the installed command) imports: the environment's fuzzattn, and
# the folders the install maps into it (pyproject.toml's package-dir).
_PACKAGES = ("fuzzattn", "kernels", "strategies")
_INSTALLED = ("import importlib.util as u; "
              "print(*(u.find_spec(m).origin for m in ('fuzzattn', 'fuzzattn.kernels', 'fuzzattn.strategies')))")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Stop at once unless the environment's fuzzattn is this checkout (`pip install -e .`, as
    .ci/run does): the suite's subprocesses would judge another checkout's code, or none."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return                      # the controller checked the same environment
    done = subprocess.run([sys.executable, "-c", _INSTALLED], cwd=tempfile.gettempdir(),
                          capture_output=True, text=True, timeout=120)
    found = [str(Path(origin).resolve()) for origin in done.stdout.split()]
    if done.returncode != 0 or found != [str(_ROOT / f / "__init__.py") for f in _PACKAGES]:
        found = " ".join(found) if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]
        raise pytest.UsageError(f"this suite tests {_ROOT}, but a process started outside it "
                                f"imports fuzzattn from {found}: pip install -e {_ROOT}")


# Longest first. pytest-xdist hands tests to workers in collection order, and a long test
# collected late runs alone at the end while the other workers sit idle. First the tests listed
# as longest, in their order, then the compiled or interpreted kernels' campaigns (triton_fa2's
# interpreted ones ~50 s each on a CI machine; triton_fa2's and flex's 35-110 s compiled on a
# GPU, compiles included), then the tests that start processes (CLI commands, isolated workers,
# in-process pytest runs): 30-140 s each compiled, `--durations` of
# `bash benchmarks/gpu_run.sh suite` (figures: docs/CALIBRATION.md#suite-order).
# Only the autotuned example's one fuzz run (its module fixture, 100-136 s compiled)
# is listed. With every test over 60 s there listed in measured order, pytest -n 16 on a GPU
# reported its last test but had not ended at 420 s, its workers waiting at exit on inductor's
# compile pools, against 305 s in this order; until that is understood, one entry.
# Paths from the repository root (tests/meta/test_provenance.py checks that each exists).
_LONGEST = ("tests/user_facing/test_autotuned_example.py::test_one_fuzz_run",)
_CAMPAIGNS = ("tests/kernels/test_differential.py::test_matches_oracle",
              "tests/gradients/test_gradients.py::test_gradients_match_oracle",
              "tests/relations/test_metamorphic.py::test_real_",
              "tests/relations/test_grad_metamorphic.py::test_real_backward_obeys")
_COMPILED = ("triton_fa2", "flex")
_PROCESSES = ("tests/regression_files/test_expected_failures.py", "tests/isolation/test_watched.py",
              "tests/isolation/test_isolation.py", "tests/cli/test_cli.py",
              "tests/meta/test_install_layout.py", "tests/meta/test_benchmarks.py",
              "tests/user_facing/test_public_api.py", "tests/regression_files/test_fixtures.py",
              "tests/judging/test_tiers.py", "tests/strategies/test_palette.py",
              "tests/cli/test_cli_mutants.py", "tests/cli/test_workers.py")


def rank(nodeid: str) -> tuple:
    """Where a test goes in the suite's order: the measured longest in their order, then the
    kernels' campaigns, then the tests that start processes, then the rest."""
    for i, part in enumerate(_LONGEST):
        if part in nodeid:
            return (0, i)
    if any(part in nodeid for part in _CAMPAIGNS) and any(k in nodeid for k in _COMPILED):
        return (1, 0)
    return (2, 0) if nodeid.split("::")[0] in _PROCESSES else (3, 0)


def pytest_collection_modifyitems(items):
    ranks = {item.nodeid: rank(item.nodeid) for item in items}
    items.sort(key=lambda item: ranks[item.nodeid])          # stable: the rest keep their order
    items[:] = _dealt(items, [ranks[item.nodeid] < (3,) for item in items],
                      int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))


def _dealt(items: list, long: list, workers: int) -> list:
    """The order for --dist worksteal, which hands worker i the i-th of `workers` equal
    contiguous slices before any stealing: the long tests dealt round-robin to the slices'
    fronts, longest first, each slice then filled up in order. Sorted but not dealt, the long
    ones sat in the first slices, and the workers that stole them late ran alone at the end
    (pytest -n 16 on a GPU: 339 s against 248 s of test time per worker). Every worker
    collects the same list, so every worker computes the same order."""
    if workers < 2:
        return items
    size = [len(items) // workers + (i < len(items) % workers) for i in range(workers)]
    slices: list[list] = [[] for _ in range(workers)]
    heavy = [item for item, is_long in zip(items, long) if is_long]
    for i, item in enumerate(heavy):      # never past a slice's size: len(heavy) <= len(items)
        slices[i % workers].append(item)
    rest = iter(item for item, is_long in zip(items, long) if not is_long)
    for w in range(workers):
        slices[w] += [next(rest) for _ in range(size[w] - len(slices[w]))]
    return [item for part in slices for item in part]


# pytester's in-process runs put sys.modules back as they found it, dropping every module first
# imported inside them. A library cannot be imported twice: torch.compile's modules, first loaded
# by an inner run that compiled FlexAttention, then failed to re-import in every later test of
# that xdist worker ("Artifact of type=autotune already registered in mega-cache artifact
# factory"). Nor can the standard library's: an executor class cached by `concurrent.futures`
# pickles its worker function by name, and a re-imported `concurrent.futures.process` holds another
# one (PicklingError in every later `--workers` run of that worker; inductor first imports it when
# it compiles). Libraries and the standard library are kept; the plugin's tests only need their
# own files undone.
_LIBRARIES = {"torch", "triton", "sympy", "numpy", "functorch", "hypothesis"} | sys.stdlib_module_names


def _keep_libraries():
    import _pytest.pytester as pytester_module
    snapshot = pytester_module.SysModulesSnapshot

    class LibrariesKept(snapshot):
        def __init__(self, preserve=None):
            def keep(name: str) -> bool:
                return name.partition(".")[0] in _LIBRARIES or bool(preserve and preserve(name))
            super().__init__(preserve=keep)

    pytester_module.SysModulesSnapshot = LibrariesKept


_keep_libraries()
