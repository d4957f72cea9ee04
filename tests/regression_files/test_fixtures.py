"""Regression fixtures: capture, atomic concurrent writes, validation, replay, drift."""
from __future__ import annotations

import json
import multiprocessing
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fuzzattn import AttentionCase, Capabilities, Implementation
from fuzzattn.campaigns.campaign import Counterexample, check_case
from fuzzattn.campaigns.regression_file import RegressionFile, RegressionFileError, discover, load, loadable, parse, write
from fuzzattn.run.registry import implementations, mutants
from fuzzattn.campaigns.file_replay import replay_one
from fuzzattn.kernels.sdpa import sdpa_forward

CASE = AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=3, seq_k=5, head_dim=16)


def _wrong_scale(q, k, v, *, causal, scale):
    return sdpa_forward(q, k, v, causal=causal, scale=2 * scale)


WRONG_SCALE = Implementation("wrong_scale", _wrong_scale,
                             Capabilities(head_dims=None, causal=("top_left", "bottom_right")))


def test_failure_writes_a_complete_fixture_and_says_how_to_replay(tmp_path):
    with pytest.raises(Counterexample) as excinfo:
        check_case(WRONG_SCALE, CASE, regressions_dir=tmp_path)
    path = tmp_path / f"{CASE.key()}.json"
    assert excinfo.value.path == path
    assert f"fuzzattn replay {path}" in str(excinfo.value)
    fixture = load(path)
    assert fixture.case == CASE and fixture.impl == "wrong_scale" and fixture.check == "out"
    assert fixture.observed_error > fixture.allowed_error > 0
    assert set(fixture.versions) == {"torch", "triton", "hypothesis", "fuzzattn"}
    assert len(fixture.inputs_sha256) == 64 and fixture.covers and fixture.found


def test_same_case_is_written_once(tmp_path):
    first = write(RegressionFile(case=CASE, covers="first"), tmp_path)
    second = write(RegressionFile(case=CASE, covers="second"), tmp_path)
    assert (first.path, first.new) == (tmp_path / f"{CASE.key()}.json", True)
    assert (second.path, second.new) == (first.path, False)
    assert load(first.path).covers == "first"
    assert [p.name for p in tmp_path.iterdir()] == [first.path.name]   # no temporary files left


def _hammer(args):
    directory, worker = args
    written = []
    for i in range(40):
        # half the cases are shared by every worker (a dedupe race), half are the worker's own
        seed = i if i % 2 == 0 else 1000 * (worker + 1) + i
        case = CASE.replace(data_seed=seed)
        done = write(RegressionFile(case=case, covers=f"worker {worker}"), directory)
        if done.new:
            written.append(done.path.name)
    return written


def test_concurrent_writers_never_lose_or_corrupt_a_fixture(tmp_path):
    workers = 4
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        results = pool.map(_hammer, [(str(tmp_path), w) for w in range(workers)])
    names = [n for r in results for n in r]
    assert len(names) == len(set(names)), "a fixture was reported new by two writers"
    expected = {CASE.replace(data_seed=s).key() + ".json" for s in range(0, 40, 2)}
    expected |= {CASE.replace(data_seed=1000 * (w + 1) + i).key() + ".json"
                 for w in range(workers) for i in range(1, 40, 2)}
    on_disk = {p.name for p in tmp_path.iterdir()}
    assert on_disk == expected == set(names)
    for path in tmp_path.iterdir():
        load(path)          # every file parses: none is half-written


@pytest.mark.parametrize("data,message", [
    pytest.param({"schema": 1}, "missing required field 'case'", id="no-case"),
    pytest.param({"schema": 3, "case": CASE.to_dict()}, "unsupported schema version 3", id="schema-3"),
    pytest.param({"schema": 1, "case": CASE.to_dict(), "colour": "red"}, "unknown field 'colour'",
                 id="unknown-field"),
    pytest.param({"schema": "1", "case": CASE.to_dict()}, "field 'schema' should be int", id="schema-str"),
    pytest.param({"schema": 1, "case": CASE.to_dict(), "observed_error": "big"},
                 "field 'observed_error' should be int or float or null", id="error-str"),
    pytest.param({"schema": 1, "case": {**CASE.to_dict(), "dtype": "int8"}},
                 "field 'case': dtype='int8'", id="case-dtype"),
    pytest.param([1, 2], "must be a JSON object", id="list"),
])
def test_malformed_fixture_gets_one_line_naming_the_field(data, message):
    with pytest.raises(RegressionFileError, match=message) as excinfo:
        parse(data)
    assert "\n" not in str(excinfo.value)


def test_invalid_json_names_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(RegressionFileError, match="bad.json: not valid JSON"):
        load(bad)


def test_a_truncated_file_names_where_it_ends_in_plain_words(tmp_path):
    truncated = tmp_path / "cut.json"
    truncated.write_text('{"schema": 2,\n "case": {"batch": 1,\n  "dtype": "bfloa')
    with pytest.raises(RegressionFileError) as excinfo:
        load(truncated)
    message = str(excinfo.value)
    assert message.endswith("not valid JSON: Unterminated string starting at: line 3 column 12"), message
    assert not re.search(r"\b(\w+) \1\b", message), message       # no doubled word


def test_hand_written_fixture_needs_only_schema_and_case(tmp_path):
    path = tmp_path / "from-a-bug-report.json"
    path.write_text(json.dumps({"schema": 1, "case": {"batch": 1, "heads": 2, "kv_heads": 2,
                                                      "seq_q": 1, "seq_k": 33, "head_dim": 32}}))
    fixture = load(path)
    result = replay_one(fixture, implementations()["sdpa"])
    assert result.passed, result.message


def test_replay_refuses_drifted_inputs():
    fixture = RegressionFile(case=CASE, inputs_sha256="0" * 64)
    result = replay_one(fixture, implementations()["sdpa"])
    assert not result.passed and result.verdict == "inputs_drifted"
    assert "inputs drifted" in result.message


def test_replay_fails_on_the_bug_and_passes_on_the_fix(tmp_path):
    with pytest.raises(Counterexample):
        check_case(WRONG_SCALE, CASE, regressions_dir=tmp_path)
    fixture = load(discover(tmp_path)[0])
    assert not replay_one(fixture, WRONG_SCALE).passed
    for impl in implementations().values():
        assert replay_one(fixture, impl).passed


def test_pytest_collects_fixtures_per_implementation_and_isolates_broken_ones(pytester, monkeypatch):
    regressions = pytester.mkdir("regressions")
    (regressions / "good.json").write_text(json.dumps({"schema": 1, "case": CASE.to_dict()}))
    (regressions / "broken.json").write_text(json.dumps({"schema": 1, "case": CASE.to_dict(),
                                                         "colour": "red"}))
    monkeypatch.delenv("FUZZATTN_REGRESSIONS_DIR", raising=False)
    result = pytester.runpytest("regressions", "-v", "-p", "no:cacheprovider",
                                "-p", "fuzzattn.pytest_plugin")
    outcomes = result.parseoutcomes()
    # one item per implementation that declares the case (configured ones, such as the
    # per-backend SDPA implementations, do not declare a configless case)
    supporting = [impl for impl in implementations().values() if impl.supports(CASE)]
    assert outcomes.get("passed") == len(supporting), result.stdout.str()
    assert outcomes.get("failed") == 1
    result.stdout.fnmatch_lines(["*good.json::triton_fa2 PASSED*", "*good.json::sdpa PASSED*",
                                 "*broken.json::unreadable FAILED*",     # broken files run last
                                 "*broken.json: unknown field 'colour'*"])


def test_a_truncated_file_is_the_one_failure_even_under_x(pytester, monkeypatch):
    """A half-written file fails as its own item, after everything else ran: no collection error
    (a test module reading every file at import skips it through `loadable`)."""
    regressions = pytester.mkdir("regressions")
    (regressions / "a_truncated.json").write_text('{"schema":1,"case":{')
    (regressions / "good.json").write_text(json.dumps({"schema": 1, "case": CASE.to_dict()}))
    pytester.makepyfile(test_reads_every_file="""
        from fuzzattn.campaigns.regression_file import loadable
        FILES = [p.name for p, record in loadable("regressions")]
        def test_only_the_good_file_loads():
            assert FILES == ["good.json"]
    """)
    monkeypatch.delenv("FUZZATTN_REGRESSIONS_DIR", raising=False)
    result = pytester.runpytest("-x", "-p", "no:cacheprovider", "-p", "fuzzattn.pytest_plugin",
                                "regressions", "test_reads_every_file.py")
    outcomes = result.parseoutcomes()
    supporting = [impl for impl in implementations().values() if impl.supports(CASE)]
    assert outcomes.get("failed") == 1 and "errors" not in outcomes, result.stdout.str()
    assert outcomes.get("passed") == len(supporting) + 1, result.stdout.str()
    result.stdout.fnmatch_lines(["*a_truncated.json::unreadable*"])


def test_simultaneous_failures_under_xdist_keep_every_fixture(pytester, tmp_path):
    """Two xdist workers fail at the same moment (a file barrier lines them up); every fixture
    written is intact and none is lost, including one both workers write."""
    out = tmp_path / "fixtures"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    pytester.makepyfile(test_race=textwrap.dedent(f"""
        import os, time, pytest
        from fuzzattn import AttentionCase, Capabilities, Implementation
        from fuzzattn.campaigns.campaign import check_case
        from fuzzattn.kernels.sdpa import sdpa_forward

        IMPL = Implementation("wrong_scale",
                              lambda q, k, v, *, causal, scale: sdpa_forward(q, k, v, causal=causal, scale=2 * scale),
                              Capabilities(head_dims=None))
        BASE = AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=3, seq_k=5, head_dim=16)

        @pytest.mark.parametrize("worker", [0, 1])
        def test_fail(worker):
            open(os.path.join({str(barrier)!r}, str(worker)), "w").close()
            # both workers write at once; the other one's start takes seconds on a loaded host,
            # so only a generous deadline passed means it will never come
            deadline = time.monotonic() + 120
            while len(os.listdir({str(barrier)!r})) < 2:
                assert time.monotonic() < deadline, "the other worker never reached the barrier"
                time.sleep(0.01)
            for seed in [0, 1, 2, 3] + [100 + worker]:
                try:
                    check_case(IMPL, BASE.replace(data_seed=seed), regressions_dir={str(out)!r})
                except AssertionError:
                    pass
            raise AssertionError("failed on purpose")
    """))
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider",
                                           "-p", "fuzzattn.pytest_plugin", "test_race.py")
    result.assert_outcomes(failed=2)
    names = sorted(p.name for p in out.iterdir())
    expected = sorted(f"{AttentionCase(1, 1, 1, 3, 5, 16, data_seed=s).key()}.json" for s in (0, 1, 2, 3, 100, 101))
    assert names == expected
    for path in out.iterdir():
        assert load(path).impl == "wrong_scale"


SHIPPED = [p for p, record in loadable() if record.impl in mutants()]


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_fixture_fails_on_its_mutant(path):
    """That the real kernels pass it is the suite's item `regressions/<file>::<kernel>`, one per
    kernel that declares its case (test_the_suite_replays_every_shipped_file_on_every_kernel)."""
    fixture = load(path)
    assert fixture.covers, f"{path.name} has no covers line"
    mutant = mutants()[fixture.impl]
    assert not replay_one(fixture, mutant).passed, f"{path.name} no longer catches {mutant.name}"
    assert any(impl.supports(fixture.case) for impl in implementations().values()), \
        f"no real kernel here declares {path.name}'s case"


def test_the_suite_replays_every_shipped_file_on_every_kernel():
    """`pytest` collects regressions/ (pyproject's testpaths) as one item per file and kernel
    that declares its case or expects to fail on it: the replays of the shipped files on the
    real kernels, which no test in tests/ repeats."""
    root = Path(__file__).resolve().parents[2]
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "regressions"], cwd=root, capture_output=True, text=True)
    collected = {line.strip() for line in listed.stdout.splitlines() if "::" in line}
    assert listed.returncode == 0 and collected, listed.stdout + listed.stderr
    shipped = discover(root / "regressions")
    assert len(shipped) >= len(SHIPPED)
    for path in shipped:
        record = load(path)
        kernels = [impl.name for impl in implementations().values()
                   if impl.supports(record.case) or impl.name in record.expected_failures]
        assert kernels, path.name
        for name in kernels:
            assert f"regressions/{path.name}::{name}" in collected, (path.name, name)


def test_every_mutant_has_a_shipped_fixture():
    covered = {load(p).impl for p in SHIPPED}
    missing = sorted(set(mutants()) - covered)
    assert not missing, f"mutants without a fixture in regressions/: {missing}"


def test_pytest_option_fuzzes_an_implementation_outside_the_repo(pytester, tmp_path, monkeypatch,
                                                                capsys):
    """--fuzzattn-impl brings an outside kernel into the differential tests and fixture replay."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "my_attention.py").write_text(textwrap.dedent("""
        import torch
        def attention(q, k, v, *, causal, scale):
            s = (q.float() @ k.float().transpose(-1, -2)) * scale
            if causal:
                n, m = s.shape[-2:]
                s = s.masked_fill(torch.ones(n, m, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
            p = s.softmax(-1)
            if q.shape[2] > 16:
                p = p.flip(-1)           # planted bug: wrong past one tile of queries
            return (p @ v.float()).to(q.dtype)
    """))
    pytester.makepyfile(test_outside=textwrap.dedent("""
        from hypothesis import given, settings, strategies as st
        from fuzzattn.campaigns.campaign import check_case
        from fuzzattn.settings import outside_implementations
        from fuzzattn.strategies import attention_cases

        @settings(max_examples=60, derandomize=True, database=None)
        @given(st.data())
        def test_outside(data):
            (impl,) = outside_implementations()
            check_case(impl, data.draw(attention_cases(impl.caps)))
    """))
    fixtures = tmp_path / "found"
    monkeypatch.setenv("FUZZATTN_REGRESSIONS_DIR", str(fixtures))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "fuzzattn.pytest_plugin", f"--fuzzattn-impl={outside / 'my_attention.py'}:attention",
        "test_outside.py", "-x")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]FAIL[]] attention out*", f"*regression file: {fixtures}*",
                                 "*replay:  fuzzattn replay*"])
    (written,) = fixtures.iterdir()
    assert load(written).impl == "attention" and load(written).case.seq_q > 16
    # The printed hint works verbatim: it names the outside kernel's --impl, and replaying with
    # it fails the same way.
    argv = re.search(r"replay:\s+(fuzzattn replay .*)$", result.stdout.str(), re.M).group(1).split()
    assert argv[:2] == ["fuzzattn", "replay"]
    assert f"{outside / 'my_attention.py'}:attention" in argv
    from fuzzattn.cli import main
    assert main(argv[1:]) == 1
    assert load(written).check in capsys.readouterr().out.split("FAIL", 2)[-1]
