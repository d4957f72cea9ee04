"""The `fuzzattn` command, run in-process through `main([...])` with tiny budgets.

A purpose-built broken implementation lives in a temporary file outside the repo, so the tests
also cover loading FILE.py:NAME. Every fixture goes to a temporary directory: FUZZATTN_REGRESSIONS_DIR
points there for the whole module, so nothing can land in regressions/.
"""
from __future__ import annotations

import io
import re
from contextlib import redirect_stdout
import os
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fuzzattn import cli
from fuzzattn.campaigns.outcome import OK, Outcome
from fuzzattn.cli import changes, workers
from fuzzattn.campaigns.regression_file import load

from purpose_built import DROP_LAST_KEY_SOURCE as BROKEN


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    # A stray default must never write into the repo's regressions/, and CI must not matter.
    monkeypatch.setenv("FUZZATTN_REGRESSIONS_DIR", str(tmp_path / "default-fixtures"))
    monkeypatch.delenv("CI", raising=False)


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("outside") / "broken.py"
    path.write_text(BROKEN)
    return str(path)


@pytest.fixture(scope="module")
def found(broken, tmp_path_factory):
    """Fuzz the broken implementation once; (exit status, stdout, the fixture it wrote)."""
    fixtures_dir = tmp_path_factory.mktemp("found")
    out = io.StringIO()
    with redirect_stdout(out):          # capsys is function-scoped; this fixture is not
        status = cli.main(["fuzz", "--impl", f"{broken}:drop_last_key", "--dtype", "float32",
                           "--max-examples", "10", "--regressions-dir", str(fixtures_dir)])
    written = sorted(fixtures_dir.glob("*.json"))
    return status, out.getvalue(), written


def run(capsys, *argv):
    status = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# -- fuzz ---------------------------------------------------------------------------------------
def test_fuzz_passing_implementation_exits_0(capsys, tmp_path):
    status, out, err = run(capsys, "fuzz", "--impl", "sdpa", "--dtype", "float32",
                           "--max-examples", 5, "--regressions-dir", tmp_path)
    assert status == 0, out + err
    assert "sdpa" in out and "float32" in out and "1 passed, 0 failed" in out
    assert not list(tmp_path.glob("*.json"))


def test_fuzz_broken_implementation_exits_1_and_writes_a_fixture(found):
    status, out, written = found
    assert status == 1
    assert len(written) == 1
    assert "FAIL" in out and "bad query rows (x) per batch/head" in out   # the heatmap
    assert f"fixture: {written[0]}" in out or written[0].name in out
    assert "fuzzattn replay" in out and "--impl" in out
    assert "--hypothesis-seed 0" in out                                               # how it was found


def test_fuzz_no_save_writes_nothing(capsys, broken, tmp_path):
    status, out, _ = run(capsys, "fuzz", "--impl", f"{broken}:drop_last_key", "--dtype", "float32",
                         "--max-examples", 10, "--regressions-dir", tmp_path, "--no-save")
    assert status == 1
    assert not list(tmp_path.glob("*.json"))
    assert "not written" in out


SLOW = textwrap.dedent('''
    """Correct attention that takes 50 ms a call, on any device and with nothing to compile."""
    import time
    import torch

    def attention(q, k, v, *, causal, scale):
        time.sleep(0.05)        # slow on purpose: a 0.2 s cap ends the campaign within a few cases
        s = (q.double() @ k.double().transpose(-1, -2)) * scale
        lse = torch.logsumexp(s, -1)
        return (torch.exp(s - lse[..., None]) @ v.double()).to(q.dtype), lse.float()
''')


def test_fuzz_time_cap_reports_the_cases_it_judged(capsys, tmp_path):
    path = tmp_path / "slow.py"
    path.write_text(SLOW)
    status, out, _ = run(capsys, "fuzz", "--impl", f"{path}:attention", "--dtype", "float32",
                         "--max-examples", 40, "--seconds", 0.2, "--regressions-dir", tmp_path)
    assert status == 0, out
    row = next(line for line in out.splitlines() if line.startswith("attention "))
    assert re.split(r"\s{2,}", row)[5] == "time cap 0.2 s", row
    assert 1 <= int(row.split()[3]) < 40, row


# -- replay -------------------------------------------------------------------------------------
def test_replay_fails_on_the_broken_implementation(capsys, found, broken):
    fixture = found[2][0]
    status, out, _ = run(capsys, "replay", fixture, "--impl", f"{broken}:drop_last_key")
    assert status == 1
    assert "FAIL" in out and "out" in out and "bad query rows" in out


def test_a_replay_stopped_by_sigterm_still_reports_what_it_replayed(capsys, monkeypatch, tmp_path):
    """A CI step's timeout sends SIGTERM: the files replayed so far are printed, with a last line
    saying so, and the exit status is 143 (seen on the H200: a replay cut by `timeout` printed
    nothing at all)."""
    import signal
    from fuzzattn.campaigns import file_replay as replay_module
    real, calls = replay_module.replay_one, []

    def replay_one(record, impl, **kw):
        calls.append(record)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(record, impl, **kw)

    monkeypatch.setattr(replay_module, "replay_one", replay_one)
    # Four files sdpa_math replays (no configuration, no variant it does not declare), so none
    # is skipped before the signal.
    shipped = sorted((Path(__file__).resolve().parents[2] / "regressions").glob("*.json"))
    plain = [p for p in shipped if not any(f'"{field}"' in p.read_text()
                                           for field in ("config", "window", "softcap",
                                                         "alibi", "paged_kv", "seqlens_q"))][:4]
    for path in plain:
        (tmp_path / path.name).write_text(path.read_text())
    before = signal.getsignal(signal.SIGTERM)
    status, out, _ = run(capsys, "replay", tmp_path, "--impl", "sdpa_math", "--workers", 1)
    assert status == 143
    assert re.search(r"stopped by SIGTERM after 2 of 4 regression file\(s\): 2 passed", out), out
    assert signal.getsignal(signal.SIGTERM) is before          # the handler is put back


def test_replay_passes_on_sdpa_and_on_every_registered_implementation(capsys, found):
    fixture = found[2][0]
    status, out, _ = run(capsys, "replay", fixture, "--impl", "sdpa")
    assert status == 0, out
    status, out, _ = run(capsys, "replay", fixture.parent)          # a directory: every *.json
    rows = {line.split()[1]: line.split()[2] for line in out.splitlines() if line.startswith(fixture.name)}
    assert rows["sdpa"] == "ok" and rows["torch_tiled"] == "ok", out
    # and the broken kernel the file records (its impl_spec), which still fails
    assert status == 1 and rows["drop_last_key"] == "FAIL", out


def test_malformed_fixture_fails_naming_the_field_and_the_others_still_run(capsys, found, tmp_path):
    shutil.copy(found[2][0], tmp_path / found[2][0].name)
    (tmp_path / "bad.json").write_text('{"schema": 1, "case": {"batch": "two"}}')
    status, out, err = run(capsys, "replay", tmp_path, "--impl", "sdpa")
    assert status == 1
    assert "bad.json" in out and "'case'" in out and "malformed" in out
    assert "ok" in out                                   # the good fixture was replayed
    assert "Traceback" not in out + err


# -- bad inputs: one line, exit 2 -------------------------------------------------------------------
BAD = [
    pytest.param(["fuzz", "--impl", "no_such_impl"], "unknown implementation 'no_such_impl'", id="unknown-impl"),
    pytest.param(["fuzz", "--impl", "/nonexistent/dir/attn.py:f"], "does not exist", id="missing-file"),
    pytest.param(["fuzz", "--impl", "{broken}:nope"], "no attribute 'nope'", id="missing-name"),
    pytest.param(["fuzz", "--impl", "{broken}:NOT_CALLABLE"], "not callable", id="non-callable"),
    pytest.param(["fuzz", "--impl", "no_such_module_xyz:f"], "cannot import module", id="missing-module"),
    pytest.param(["fuzz", "--impl", "sdpa", "--max-examples", "0"], "--max-examples", id="zero-examples"),
    pytest.param(["fuzz", "--impl", "sdpa", "--seconds", "-1"], "--seconds", id="negative-seconds"),
    pytest.param(["fuzz", "--impl", "sdpa", "--profile", "huge"], "--profile", id="bad-profile"),
    pytest.param(["fuzz", "--impl", "{broken}:drop_last_key", "--dtype", "float16"],
                 "not declared by drop_last_key", id="undeclared-dtype"),
    pytest.param(["replay", "/nonexistent/fixture.json"], "no such file", id="missing-fixture"),
    pytest.param(["mutants", "--only", "mutant_not_there"], "not a mutant", id="unknown-mutant"),
    pytest.param(["gate", "--changed-since", "no-such-revision-xyz"], "no-such-revision-xyz", id="bad-rev"),
    pytest.param(["gate", "--changed-since", "--oops"], "--changed-since", id="rev-like-option"),
    pytest.param([], "required", id="no-command"),
]


@pytest.mark.parametrize("argv,expected", BAD)
def test_bad_input_is_one_line_and_exit_2(capsys, broken, argv, expected):
    status, out, err = run(capsys, *[a.format(broken=broken) for a in argv])
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fuzzattn: error:")
    assert expected in lines[0]
    assert "Traceback" not in out + err


# -- gate ---------------------------------------------------------------------------------------
def test_gate_writes_junit_xml_and_markdown(capsys, found, tmp_path):
    fixtures_dir = tmp_path / "fixtures"
    fixtures_dir.mkdir()
    shutil.copy(found[2][0], fixtures_dir)
    junit, summary = tmp_path / "out" / "gate.xml", tmp_path / "gate.md"
    status, out, err = run(capsys, "gate", "--max-examples", 2, "--seconds", 2, "--regressions-dir",
                           fixtures_dir, "--junit-xml", junit, "--markdown", summary)
    assert status == 0, out + err
    assert "gate passed" in out
    root = ET.parse(junit).getroot()
    cases = root.findall(".//testcase")
    stages = {c.get("classname") for c in cases}
    assert {"fuzzattn.replay", "fuzzattn.fuzz"} <= stages
    assert root.get("failures") == "0" and int(root.get("tests")) == len(cases)
    text = summary.read_text()
    assert text.startswith("## fuzzattn gate: passed") and "| stage | subject |" in text


def test_gate_fails_when_an_outside_implementation_breaks(capsys, found, broken, tmp_path):
    fixtures_dir = tmp_path / "fixtures"
    fixtures_dir.mkdir()
    shutil.copy(found[2][0], fixtures_dir)
    junit = tmp_path / "gate.xml"
    status, out, _ = run(capsys, "gate", "--max-examples", 2, "--seconds", 2, "--regressions-dir",
                         fixtures_dir, "--impl", f"{broken}:drop_last_key", "--junit-xml", junit)
    assert status == 1
    assert "gate FAILED" in out
    failures = ET.parse(junit).getroot().findall(".//failure")
    assert failures and all(f.get("message") for f in failures)
    assert any("drop_last_key" in (f.text or "") for f in failures)
    # The printed hint works verbatim: the replay command fails the same way (exit 1, same check).
    argv = re.search(r"replay:\s+(fuzzattn replay .*)$", out, re.M).group(1).split()
    assert f"{broken}:drop_last_key" in argv
    written = load(argv[2])
    status, replayed, _ = run(capsys, *argv[1:])
    assert status == 1 and f"FAIL     {written.check}" in replayed, replayed


def test_fuzz_found_by_command_finds_it_again(capsys, found, broken, tmp_path):
    """The "found by" line is a working command for an outside kernel: same failure, same file."""
    argv = re.search(r"found by:\s+(fuzzattn fuzz .*)$", found[1], re.M).group(1).split()
    assert f"{broken}:drop_last_key" in argv
    status, again, _ = run(capsys, *argv[1:], "--regressions-dir", tmp_path)
    assert status == 1, again
    (written,) = tmp_path.glob("*.json")
    assert written.name == found[2][0].name and load(written).check == load(found[2][0]).check


def test_gate_changed_since_fuzzes_only_what_changed(capsys, monkeypatch, tmp_path):
    from fuzzattn.kernels import sdpa
    monkeypatch.setattr(changes, "changed_files", lambda rev: {Path(sdpa.__file__).resolve()})
    status, out, _ = run(capsys, "gate", "--max-examples", 2, "--regressions-dir", tmp_path,
                         "--changed-since", "HEAD", "--allow-empty")
    assert status == 0, out
    assert "fuzzing sdpa" in out
    assert "sdpa float32" in out
    assert "triton_fa2 float32" not in out and "unchanged since HEAD" in out


def test_gate_with_no_regression_file_fails_unless_allowed(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(changes, "changed_files", lambda rev: set())
    status, out, _ = run(capsys, "gate", "--max-examples", 1, "--regressions-dir", tmp_path,
                         "--changed-since", "HEAD")
    assert status == 1 and "no regression files to replay" in out and "gate FAILED" in out
    status, out, _ = run(capsys, "gate", "--max-examples", 1, "--regressions-dir", tmp_path,
                         "--changed-since", "HEAD", "--allow-empty")
    assert status == 0 and "gate passed" in out


def test_gate_changed_since_harness_change_fuzzes_everything(capsys, monkeypatch, tmp_path):
    judge_file = Path(cli.__file__).resolve().parent.parent / "judgement" / "judge.py"
    monkeypatch.setattr(changes, "changed_files", lambda rev: {judge_file})
    status, out, _ = run(capsys, "gate", "--max-examples", 1, "--seconds", 1, "--regressions-dir",
                         tmp_path, "--changed-since", "HEAD", "--allow-empty")
    assert status == 0, out
    assert "harness changed" in out and "triton_fa2 float32" in out


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_changed_files_reads_git(tmp_path):
    root = Path(cli.__file__).resolve().parents[2]
    inside = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True)
    if inside.returncode != 0:
        pytest.skip("not a git checkout with a commit")
    changed = changes.changed_files("HEAD")
    assert all(p.is_absolute() for p in changed)


DECLARED = textwrap.dedent('''
    """A declared implementation outside the repo: bottom-right causal only, fp32, GQA, and a
    planted bug (the diagonal offset uses Nq - Nk instead of Nk - Nq)."""
    import torch
    from fuzzattn import Capabilities, Implementation

    def attention(q, k, v, *, causal, scale):
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        s = (q.double() @ k.double().transpose(-1, -2)) * scale
        n, m = s.shape[-2:]
        if causal:
            visible = torch.ones(n, m, dtype=torch.bool, device=s.device).tril(diagonal=n - m)   # planted bug
            s = s.masked_fill(~visible, float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        return (p @ v.double()).to(q.dtype), lse.float()

    IMPL = Implementation(
        name="outside_bottom_right", fn=attention,
        caps=Capabilities(dtypes={"float32"}, head_dims={16, 32}, causal=("bottom_right",),
                          gqa=True, zero_length=False),
        description="bottom-right causal attention kept in another repository")
''')


def test_declared_implementation_outside_the_repo_is_fuzzed_within_its_declaration(capsys, tmp_path):
    path = tmp_path / "declared.py"
    path.write_text(DECLARED)
    status, out, _ = run(capsys, "fuzz", "--impl", f"{path}:IMPL", "--max-examples", "40",
                         "--regressions-dir", tmp_path / "fx")
    assert status == 1, out
    # the wrong diagonal shows two ways, on disjoint cases: NaN rows where Nq < Nk, keys for
    # rows that must have none where Nq > Nk; each is a defect of its own, saved once
    fixtures = [load(p) for p in (tmp_path / "fx").glob("*.json")]
    assert 1 <= len(fixtures) <= 2, out
    for fixture in fixtures:
        assert fixture.impl == "outside_bottom_right"
        assert fixture.case.causal == "bottom_right" and fixture.case.seq_q != fixture.case.seq_k
        assert fixture.case.dtype == "float32" and fixture.case.head_dim in (16, 32)
    assert len({f.check for f in fixtures}) == len(fixtures)


@pytest.mark.parametrize("name, value, message", [
    ("FUZZATTN_PALETTE", "sometimes", "FUZZATTN_PALETTE='sometimes' is not one of auto, off, on"),
    ("FUZZATTN_COMPILE_AHEAD", "always", "FUZZATTN_COMPILE_AHEAD='always' is not one of on, off"),
    ("FUZZATTN_HOST_JUDGE_MACS", "many", "FUZZATTN_HOST_JUDGE_MACS='many' is not an integer"),
    ("FUZZATTN_HOST_CHECK_ELEMENTS", "-3", "FUZZATTN_HOST_CHECK_ELEMENTS='-3' must be >= 0"),
    ("FUZZATTN_MPS", "maybe", "FUZZATTN_MPS='maybe' is not one of auto, on, off"),
])
def test_a_bad_environment_setting_is_one_line_before_anything_runs(capsys, monkeypatch, name,
                                                                      value, message):
    monkeypatch.setenv(name, value)
    assert cli.main(["fuzz", "--impl", "sdpa", "--dtype", "float32", "--max-examples", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"fuzzattn: error: {message}") and captured.err.count("\n") == 1
    assert "judged" not in captured.out


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`fuzzattn mutants --list | head -1`: the reader leaves, and the command stops with the
    shell's SIGPIPE status and nothing on stderr, not an internal error."""
    child = subprocess.Popen([sys.executable, "-m", "fuzzattn.cli", "mutants", "--list"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()                    # gone before the first line
    err = child.stderr.read().decode()
    assert child.wait(timeout=300) == 141, err
    assert err == "", err


def test_gate_replay_takes_at_most_its_share_and_names_what_it_left(capsys, tmp_path):
    fixtures_dir = tmp_path / "fixtures"
    fixtures_dir.mkdir()
    shipped = sorted((Path(__file__).resolve().parents[2] / "regressions").glob("*.json"))
    for path in shipped[:12]:
        shutil.copy(path, fixtures_dir)
    # a budget whose quarter ends before the replay can begin: every file left is a skip row
    status, out, err = run(capsys, "gate", "--max-examples", 1, "--budget", "1e-6",
                           "--regressions-dir", fixtures_dir, "--workers", 1)
    assert status == 0, out + err
    left = out.count("not replayed: the replay's share of the budget was spent")
    assert left == 12, out
    assert ("12 regression file(s) not replayed in full: the replay's share (0 s of the 1e-06 s "
            "budget)") in out
    assert "0 of 12 regression file(s) replayed in full" in out
    assert "--budget" in out and "gives it ~10 s" in out          # what a campaign would need


def test_gate_replays_the_smallest_cases_first(tmp_path):
    """A replay cut by its share then leaves out the fewest files (a GPU campaign's large cases
    take seconds each under the interpreter); a file that does not load comes first."""
    from fuzzattn.cli.replay import smallest_first
    shipped = sorted((Path(__file__).resolve().parents[2] / "regressions").glob("*.json"))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    ordered = smallest_first(shipped + [broken])
    assert ordered[0] == broken and sorted(ordered[1:]) == shipped
    sizes = [load(path).case.macs for path in ordered[1:]]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


def test_gate_gives_the_brought_kernel_most_of_the_fuzzing_time(capsys, monkeypatch, broken,
                                                                 tmp_path):
    shares = []

    def instant(pool, impl, dtype, **kw):           # a campaign that ends at once
        shares.append((impl.name, kw["seconds"]))
        return Outcome("fuzz", f"{impl.name} {dtype}", OK, True, 1, 0.0)

    monkeypatch.setattr(workers, "run_campaign", instant)
    status, out, _ = run(capsys, "gate", "--budget", 100, "--regressions-dir", tmp_path,
                         "--allow-empty", "--impl", f"{broken}:drop_last_key")
    assert status == 0, out
    mine = [s for name, s in shares if name == "drop_last_key"]
    stock = [s for name, s in shares if name != "drop_last_key"]
    assert shares[0][0] == "drop_last_key" and mine and len(stock) >= 3
    # 60% of what the replay (of nothing) left, ~the whole budget, shared by its dtypes
    assert 0.55 * 100 / len(mine) < mine[0] <= 0.6 * 100 / len(mine)
    # the stock campaigns share the rest, and what a campaign leaves unused passes on: here the
    # brought ones ended at once, so the first stock one gets an equal part of nearly all of it
    assert stock[0] == pytest.approx(100 / len(stock), rel=0.1)
    assert stock[-1] == pytest.approx(100, rel=0.1)
