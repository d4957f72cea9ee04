"""A new user's first hour: README's own-kernel test with a planted causal-mask bug, run as they
would run it (pytest from their project's directory), must fail in a short report that names the
kernel, the check and the case, print a replay command that runs as printed, and save a
regression file that replays from a copy of the project."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fuzzattn
from fuzzattn import AttentionCase, Counterexample, check_case

KERNEL = textwrap.dedent('''
    import torch
    from fuzzattn import Capabilities, Implementation, refuse

    def my_attention(q, k, v, *, causal, scale):
        if q.dtype != torch.float32:
            refuse("dtype", q.dtype, "float32")
        s = (q @ k.transpose(-1, -2)) * scale
        if causal:   # the planted bug: triu(2) lets each query row see one key too many
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(2), float("-inf"))
        return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)

    MINE = Implementation("mine", my_attention, Capabilities(dtypes={"float32"}, head_dims={16, 32}))
''')

# README's example test, derandomized so that it finds the bug on every run.
USER_TEST = KERNEL + textwrap.dedent('''
    from hypothesis import given, settings
    from fuzzattn import attention_cases, check_case

    @settings(max_examples=25, deadline=None, derandomize=True)
    @given(attention_cases(MINE.caps))
    def test_mine(case):
        check_case(MINE, case)
''')

CASE = AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=1, seq_k=2, head_dim=16, causal="top_left")


def _env() -> dict:
    """The user's shell: this environment's commands on PATH, an 80-column terminal, and none of
    the settings of the test run around it."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "FUZZATTN_", "HYPOTHESIS_"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["COLUMNS"] = "80"
    return env


def _run(command, cwd: Path, shell: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=_env(), shell=shell, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """(project directory, pytest's result) of the user's test run on the planted bug."""
    project = tmp_path_factory.mktemp("project")
    (project / "test_mine.py").write_text(USER_TEST)
    result = _run([sys.executable, "-m", "pytest", "test_mine.py", "-p", "no:cacheprovider"], project)
    assert result.returncode == 1, result.stdout + result.stderr
    return project, result.stdout


def _failure_section(output: str) -> list[str]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"_+ test_mine _+", line))
    end = next(i for i, line in enumerate(lines) if "short test summary info" in line)
    return lines[start:end]


def test_the_failure_reads_like_a_library_assertion(planted):
    _, output = planted
    section = _failure_section(output)
    text = "\n".join(section)
    assert len(section) <= 30, text
    package = os.path.dirname(fuzzattn.__file__)
    assert package not in text and "campaign.py" not in text, text       # no frame of ours
    assert "Explanation:" not in text, text         # nor Hypothesis's lines about our code
    assert re.search(r"E +fuzzattn\.Counterexample: mine: out wrong on B=1 H=1 Nq=1 Nk=2 D=16 fp32 "
                     r"causal=top_left .*\(error \S+ > allowed \S+\)", text), text
    summary = next(line for line in output.splitlines() if line.startswith("FAILED test_mine.py"))
    assert "Counterexample: mine: out" in summary, summary            # kernel and check, at 80 columns


def test_the_printed_replay_runs_as_printed(planted):
    project, output = planted
    line = next(line for line in output.splitlines() if "replay:  fuzzattn replay" in line)
    command = line.split("replay:", 1)[1].strip()
    assert command.endswith("--impl test_mine.py:MINE"), command
    check = re.search(r"Counterexample: mine: (\w+) wrong", output).group(1)
    replay = _run(command, project, shell=True)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    row = next(line.split() for line in replay.stdout.splitlines() if line.split()[1:3] == ["mine", "FAIL"])
    assert row[3] == check, replay.stdout
    saved = json.loads(next((project / "regressions").glob("*.json")).read_text())
    assert saved["impl_spec"] == "test_mine.py:MINE"
    assert saved["covers"] == "mine: wrong out with causal=top_left and Nq<Nk"


def test_a_regression_file_replays_from_a_copy_of_the_project(tmp_path):
    """Written in one tree with its kernel named by an absolute path, replayed in a copy of that
    tree, from another directory, after the original is gone, with no --impl: the same verdict."""
    from fuzzattn.run.loader import load_implementation
    original = tmp_path / "original"
    (original / "kernels").mkdir(parents=True)
    (original / "kernels" / "mine.py").write_text(KERNEL)
    impl = load_implementation(f"{original / 'kernels' / 'mine.py'}:MINE")
    with pytest.raises(Counterexample) as found:
        check_case(impl, CASE, regressions_dir=original / "regressions")
    first = found.value.judged.first_failure
    saved = json.loads(found.value.path.read_text())
    assert saved["impl_spec"] == "kernels/mine.py:MINE"
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    shutil.rmtree(original)
    (copy / "docs").mkdir()
    replay = _run(["fuzzattn", "replay", f"../regressions/{found.value.path.name}", "--workers", "1"],
                  copy / "docs")
    assert replay.returncode == 1, replay.stdout + replay.stderr
    row = next(line.split() for line in replay.stdout.splitlines() if line.split()[1:2] == ["mine"])
    assert row[2:6] == ["FAIL", first.check, f"{first.error:.3g}", "/"], replay.stdout
    assert row[6] == f"{first.allowed:.3g}", replay.stdout


def test_kernel_paths_are_kept_relative_to_the_project_root(tmp_path, monkeypatch):
    from fuzzattn.campaigns.regression_file import RegressionFile, portable_spec
    directory = tmp_path / "project" / "regressions"
    monkeypatch.chdir(tmp_path)
    assert portable_spec("project/kernels/k.py:K", directory) == "kernels/k.py:K"
    assert portable_spec("/elsewhere/k.py:K", directory) == "/elsewhere/k.py:K"
    assert portable_spec("my_package.attention:K", directory) == "my_package.attention:K"
    written = RegressionFile(case=CASE, impl_spec="kernels/k.py:K", path=directory / "x.json")
    assert written.replay_spec() == "project/kernels/k.py:K"       # from where the command runs
    older = RegressionFile(case=CASE, impl_spec="/elsewhere/k.py:K", path=directory / "x.json")
    assert older.replay_spec() == "/elsewhere/k.py:K"


def test_a_covers_line_is_written_from_the_cause_unless_someone_edited_it():
    import dataclasses
    from fuzzattn.campaigns import covers
    from fuzzattn.campaigns.regression_file import RegressionFile
    cause = "needs causal=top_left lengths=Nq<Nk"
    written = RegressionFile(case=CASE, impl="mine", check="out", covers=covers.written("mine", "out", CASE))
    assert covers.with_cause(written, cause).covers == "mine: wrong out when causal=top_left Nq<Nk"
    older = dataclasses.replace(written, covers="mine failed the out check (found by fuzzing; edit "
                                                "this line to name the bug class)")
    assert covers.with_cause(older, cause).covers == "mine: wrong out when causal=top_left Nq<Nk"
    edited = dataclasses.replace(written, covers="causal mask one key too wide")
    assert covers.with_cause(edited, cause).covers == "causal mask one key too wide"
    assert covers.with_cause(edited, cause).cause == cause
