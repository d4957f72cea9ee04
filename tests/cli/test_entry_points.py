"""Every entry point runs the same whatever the working directory holds, and an internal error is
one line, a file holding its traceback, and a status of its own (fuzzattn/cli/__init__.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import fuzzattn
from fuzzattn import cli
from fuzzattn.cli import INTERNAL_ERROR_STATUS

PACKAGE = Path(fuzzattn.__file__).resolve().parent
COMMAND = Path(sys.executable).parent / "fuzzattn"       # the installed console script
START_UP = 300          # seconds for a child's imports and a few cases on a loaded CI machine


def user_env() -> dict:
    """What a user's shell has: this environment without what marks a process as part of a
    pytest-xdist or watched run, and without PYTHONPATH, where an entry for this checkout would
    mask a shadowing folder (a regular package anywhere on sys.path wins over a namespace
    package earlier on it)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTEST_XDIST", "FUZZATTN_SUPERVISED", "FUZZATTN_FLIGHT",
                                 "FUZZATTN_DEBUG"))
            and k not in ("PYTEST_CURRENT_TEST", "PYTHONPATH")}


def run_installed(*args, cwd) -> subprocess.CompletedProcess:
    """The installed console script, as a user runs it; skipped unless it imports this checkout."""
    if not COMMAND.is_file():
        pytest.skip(f"no installed fuzzattn command beside {sys.executable}")
    where = subprocess.run([sys.executable, "-I", "-c", "import importlib.util; "
                            "print(importlib.util.find_spec('fuzzattn').origin)"],
                           capture_output=True, text=True, timeout=60, env=user_env())
    if Path(where.stdout.strip()).resolve() != PACKAGE / "__init__.py":
        pytest.skip(f"the installed fuzzattn is another checkout's ({where.stdout.strip()})")
    return subprocess.run([str(COMMAND), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=START_UP, env=user_env())


@pytest.fixture
def beside_a_checkout(tmp_path) -> Path:
    """A directory holding a clone of this repository named fuzzattn/: to `python -m` or
    `python -c` it is a namespace package fuzzattn that shadows the installed one."""
    checkout = tmp_path / "fuzzattn"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text('[project]\nname = "fuzzattn"\n')
    (checkout / "fuzzattn").symlink_to(PACKAGE, target_is_directory=True)
    return tmp_path


def test_fuzz_runs_beside_a_checkout_named_fuzzattn(beside_a_checkout, tmp_path):
    done = run_installed("fuzz", "--impl", "sdpa", "--dtype", "float32", "--max-examples", "5",
                         "--regressions-dir", tmp_path / "found", "--database", "off",
                         cwd=beside_a_checkout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Traceback" not in output and "ImportError" not in output, output
    assert "1 passed, 0 failed" in done.stdout, output


def test_a_kernel_given_by_path_loads_beside_a_checkout(beside_a_checkout, tmp_path):
    """The working directory is off the child's sys.path; a kernel file named relative to it
    still loads: the loader imports it by its path."""
    (beside_a_checkout / "mine.py").write_text(
        "from fuzzattn.kernels.sdpa import sdpa_forward\n\n"
        "def mine(q, k, v, *, causal, scale):\n"
        "    return sdpa_forward(q, k, v, causal=causal, scale=scale)\n")
    done = run_installed("fuzz", "--impl", "mine.py:mine", "--dtype", "float32",
                         "--max-examples", "3", "--regressions-dir", tmp_path / "found",
                         "--database", "off", cwd=beside_a_checkout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 0 failed" in done.stdout, done.stdout + done.stderr


def test_an_internal_error_is_one_line_naming_its_traceback_file(capsys, monkeypatch, tmp_path):
    def broken(name):
        raise RuntimeError("profile table lost")
    monkeypatch.delenv("FUZZATTN_DEBUG", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(cli.common, "load_profile", broken)
    status = cli.main(["fuzz", "--impl", "sdpa", "--max-examples", "1"])
    err = capsys.readouterr().err
    assert status == INTERNAL_ERROR_STATUS and status not in (1, 2), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("fuzzattn: error: internal error: RuntimeError: profile table lost"), err
    (trace,) = tmp_path.glob("fuzzattn-internal-error-*.txt")
    assert str(trace) in err
    text = trace.read_text()
    assert "command: fuzzattn fuzz --impl sdpa --max-examples 1" in text
    assert "Traceback" in text and "in broken" in text and "profile table lost" in text


def test_an_internal_error_in_the_watched_child_keeps_its_status(tmp_path):
    """The installed command, watched: fuzzattn failing inside the child (here a kernel file
    that breaks fuzzattn's campaign runner as it loads) ends with status 70, one line."""
    (tmp_path / "sabotage.py").write_text(
        "import fuzzattn.cli.common\n"
        "from fuzzattn.kernels.sdpa import sdpa_forward\n\n"
        "def _broken(*args, **kwargs):\n"
        "    raise KeyError('campaign table')\n\n"
        "fuzzattn.cli.common.campaign_outcome = _broken\n\n"
        "def mine(q, k, v, *, causal, scale):\n"
        "    return sdpa_forward(q, k, v, causal=causal, scale=scale)\n")
    done = run_installed("fuzz", "--impl", "sabotage.py:mine", "--dtype", "float32",
                         "--max-examples", "3", "--regressions-dir", tmp_path / "found",
                         cwd=tmp_path)
    assert done.returncode == INTERNAL_ERROR_STATUS, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("fuzzattn: error: internal error: KeyError: 'campaign table'"), line
    trace = Path(line.split("traceback written to ")[1].rstrip(")"))
    assert "in _broken" in trace.read_text()
    trace.unlink()
