"""Regression files never take a run down: each kind of bad file is one failure that names the
file and the field, in `pytest` (collection never errors), in `fuzzattn replay` and in `fuzzattn
gate` (whose JUnit XML and markdown reports are still written); the good file beside them is
still replayed. And a counterexample whose directory cannot be written is still saved, at a
fallback location the run prints.
"""
from __future__ import annotations

import json
import os
import textwrap
import xml.etree.ElementTree as ET

import pytest

from fuzzattn import AttentionCase, cli
from fuzzattn.campaigns import regression_file
from fuzzattn.cli import changes

GOOD = AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=3, seq_k=5, head_dim=16).to_dict()
BUDGET_GB = "0.001"        # 1 MiB: GOOD needs a few KiB, OVER_BUDGET's float64 scores 128 MiB


def _json(case_changes: dict) -> str:
    return json.dumps({"schema": 2, "case": {**GOOD, **case_changes}})


# file name -> (its bytes, words the one-line failure must contain: the file and the field)
BAD = {
    "binary.json": (bytes(range(256)) * 4, ["binary.json", "not UTF-8"]),
    "deep.json": (b"[" * 100_000 + b"]" * 100_000, ["deep.json", "nested too deeply"]),
    "huge_seed.json": (_json({"data_seed": 2**70}).encode(), ["huge_seed.json", "'case'", "data_seed="]),
    "huge_seq.json": (_json({"seq_q": 10**9}).encode(), ["huge_seq.json", "'case'", "seq_q=1000000000"]),
    "over_budget.json": (_json({"seq_q": 4096, "seq_k": 4096, "head_dim": 64}).encode(),
                         ["over_budget.json", "'case'", "FUZZATTN_MEMORY_BUDGET_GB"]),
    "huge_scale.json": (_json({"scale": 1e308}).encode(), ["huge_scale.json", "'case'", "scale=1e+308"]),
}


@pytest.fixture
def bad_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FUZZATTN_MEMORY_BUDGET_GB", BUDGET_GB)
    monkeypatch.delenv("CI", raising=False)
    directory = tmp_path / "regressions"
    directory.mkdir()
    for name, (data, _) in BAD.items():
        (directory / name).write_bytes(data)
    (directory / "good.json").write_text(_json({}))
    return directory


def _lines_naming(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if name in line]


def test_pytest_collects_every_bad_file_as_one_failed_item(pytester, bad_dir, monkeypatch):
    monkeypatch.delenv("FUZZATTN_REGRESSIONS_DIR", raising=False)
    target = pytester.mkdir("regressions")
    for path in bad_dir.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    result = pytester.runpytest("regressions", "-v", "-p", "no:cacheprovider",
                                "-p", "fuzzattn.pytest_plugin")
    assert result.ret == 1                      # tests failed; not 2 (interrupted) or 4 (usage)
    outcomes = result.parseoutcomes()
    assert "error" not in outcomes and "errors" not in outcomes, result.stdout.str()
    assert outcomes.get("failed") == len(BAD)
    out = result.stdout.str()
    for name, (_, words) in BAD.items():
        assert f"{name}::unreadable FAILED" in out
        assert any(all(w in line for w in words) for line in out.splitlines()), (name, out)
    assert "good.json::sdpa PASSED" in out


def _run(capsys, *argv):
    status = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_replay_gives_each_bad_file_one_failing_row(capsys, bad_dir):
    status, out, err = _run(capsys, "replay", bad_dir, "--impl", "sdpa")
    assert status == 1 and not err, out + err
    for name, (_, words) in BAD.items():
        rows = [line for line in _lines_naming(out, name) if "malformed" in line]
        assert len(rows) == 1, (name, out)
        assert any(all(w in line for w in words) for line in out.splitlines()), (name, out)
    assert f"{len(BAD) + 1} regression file(s): 1 passed, {len(BAD)} failed" in out


def test_gate_fails_each_bad_file_and_still_writes_its_reports(capsys, bad_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(changes, "changed_files", lambda rev: set())     # replay only
    junit, summary = tmp_path / "gate.xml", tmp_path / "gate.md"
    status, out, err = _run(capsys, "gate", "--regressions-dir", bad_dir, "--changed-since", "HEAD",
                            "--junit-xml", junit, "--markdown", summary)
    assert status == 1 and not err, out + err
    assert "gate FAILED" in out
    failures = ET.parse(junit).getroot().findall(".//failure")
    for name, (_, words) in BAD.items():
        assert sum(name in (f.get("message") or "") for f in failures) == 1, name
        assert any(all(w in (f.text or "") + (f.get("message") or "") for w in words) for f in failures)
    text = summary.read_text()
    assert text.startswith("## fuzzattn gate: FAILED")
    assert all(name in text for name in BAD)


BROKEN = textwrap.dedent('''
    import torch

    def half_scale(q, k, v, *, causal, scale):
        s = (q.float() @ k.float().transpose(-1, -2)) * scale * 0.5
        return (s.softmax(-1) @ v.float()).to(q.dtype), torch.logsumexp(s, -1)
''')


def _fuzz_broken(capsys, tmp_path, regressions_dir, monkeypatch):
    fallback = tmp_path / "fallback"
    monkeypatch.setattr(regression_file, "FALLBACK_DIR", fallback)
    kernel = tmp_path / "half_scale.py"
    kernel.write_text(BROKEN)
    status, out, err = _run(capsys, "fuzz", "--impl", f"{kernel}:half_scale", "--dtype", "float32",
                            "--max-examples", 10, "--regressions-dir", regressions_dir)
    assert status == 1, out + err
    (saved,) = fallback.glob("*.json")
    assert f"regression file: {saved}" in out and "fallback location" in out
    assert regression_file.load(saved).check in ("out", "lse")
    return out


def test_unwritable_regressions_dir_falls_back_and_says_where(capsys, tmp_path, monkeypatch):
    """A directory path under a regular file cannot be created, by root either."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    out = _fuzz_broken(capsys, tmp_path, blocker / "regressions", monkeypatch)
    assert "is not writable" in out


def test_read_only_regressions_dir_falls_back_and_says_where(capsys, tmp_path, monkeypatch):
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        if os.access(read_only, os.W_OK):
            pytest.skip("running as root: a 0o555 directory is still writable")
        _fuzz_broken(capsys, tmp_path, read_only, monkeypatch)
        assert not list(read_only.iterdir())
    finally:
        read_only.chmod(0o755)


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_bad_profile_name_is_a_one_line_usage_error(pytester, monkeypatch, how):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    args = ["-p", "no:cacheprovider", "-p", "fuzzattn.pytest_plugin"]
    if how == "option":
        args.append("--fuzzattn-profile=nope")
    else:
        monkeypatch.setenv("FUZZATTN_PROFILE", "nope")
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.strip()]
    assert errors == ["ERROR: profile 'nope' is not one of ci, dev, gpu, nightly"], result.errlines
