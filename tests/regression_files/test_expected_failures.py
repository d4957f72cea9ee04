"""Strict expected failures: a regression file listing an implementation in `expected_failures`
is reported xfail by `replay`, by `gate` (which passes and lists it) and by the pytest item; one
that starts passing fails all three as XPASS(strict). Also: entries limited to a device type, and
the repository's own cuDNN boolean-mask leak files."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from fuzzattn import cli
from fuzzattn.campaigns.campaign import fuzz
from fuzzattn.campaigns.outcome import OK, XFAIL, XPASS
from fuzzattn.campaigns.regression_file import (ExpectedFailure, RegressionFile, RegressionFileError,
                                                load, loadable, parse, write)
from fuzzattn.campaigns.file_replay import replay_one
from fuzzattn.contract import Capabilities, Implementation, KnownDefect
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.known_defects import covering
from fuzzattn.contract.profiles import PROFILES
from fuzzattn.inputs.materialize import inputs_sha256, materialize
from fuzzattn.judgement.judge import default_device
from fuzzattn.run.loader import load_implementation
from fuzzattn.relations.forward import RELATIONS
from fuzzattn.run.registry import implementations
from fuzzattn.kernels.sdpa import sdpa_forward
from fuzzattn.kernels import flex, flex_varlen, triton_fa2
from fuzzattn.kernels.sdpa_defects import KNOWN_DEFECTS as SDPA_DEFECTS
from fuzzattn.strategies import attention_cases

ROOT = Path(__file__).resolve().parents[2]
# Every built-in implementation's declared upstream defects (flex is registered on CUDA only,
# flex_varlen nowhere: its files replay on it through their impl_spec).
KNOWN_DEFECTS = {**SDPA_DEFECTS, "flex": flex.KNOWN_DEFECTS, "flex_varlen": flex_varlen.KNOWN_DEFECTS,
                 "triton_fa2": triton_fa2.KNOWN_DEFECTS}
BUILT = ROOT / "tests" / "purpose_built.py"
LEAKY_SPEC = f"{BUILT}:BOTTOM_RIGHT_AS_TOP_LEFT"     # wrong on every bottom-right case, Nq != Nk
EXACT_SPEC = f"{BUILT}:EXACT"                          # right on everything
LEAKY, EXACT = load_implementation(LEAKY_SPEC), load_implementation(EXACT_SPEC)
CASE = AttentionCase(1, 1, 1, 2, 5, 16, causal="bottom_right", values="large", scale=1.0)
REASON = {"reason": "drops the bottom-right offset (planted)", "upstream": "purpose_built.py"}


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("FUZZATTN_REGRESSIONS_DIR", str(tmp_path / "default-fixtures"))
    monkeypatch.delenv("CI", raising=False)


def _file(directory: Path, expected: dict, case: AttentionCase = CASE) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    record = RegressionFile(case=case, covers="bottom-right offset",
                            inputs_sha256=inputs_sha256(materialize(case)),
                            expected_failures={n: ExpectedFailure(**e) for n, e in expected.items()})
    return write(record, directory).path


def run(capsys, *argv):
    status = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# -- replay -------------------------------------------------------------------------------------
def test_replay_reports_an_expected_failure_as_xfail(capsys, tmp_path):
    path = _file(tmp_path, {"bottom_right_as_top_left": REASON})
    assert replay_one(load(path), LEAKY).verdict == XFAIL
    status, out, err = run(capsys, "replay", path, "--impl", LEAKY_SPEC)
    assert status == 0, out + err
    assert "xfail" in out and "1 expected failure(s)" in out


def test_replay_fails_an_expected_failure_that_passes_as_xpass_strict(capsys, tmp_path):
    path = _file(tmp_path, {"exact": REASON})
    outcome = replay_one(load(path), EXACT)
    assert outcome.verdict == XPASS and not outcome.passed
    assert outcome.message.startswith("XPASS(strict):") and "remove the entry" in outcome.message
    status, out, _ = run(capsys, "replay", path, "--impl", EXACT_SPEC)
    assert status == 1
    assert "XPASS(strict)" in out


def _never_called(case, expected_sha256=None):
    raise AssertionError("a replay expected to hang was run")


def test_a_replay_expected_to_hang_is_xfail_without_running(tmp_path):
    """A file recording a hang that lists the implementation, or a case its known hang defect
    covers: waiting out the timeout on every replay would show nothing new."""
    path = _file(tmp_path, {"exact": dict(REASON, device=default_device())})
    record = dataclasses.replace(load(path), check="hang")
    outcome = replay_one(record, EXACT, judge_fn=_never_called)
    assert outcome.verdict == XFAIL and outcome.passed, outcome.message
    assert "not run, expected to hang: drops the bottom-right offset" in outcome.message
    assert outcome.judged.first_failure.check == "hang" and outcome.detail == "hang"
    # The same file on an implementation it does not list is run (and passes here).
    assert replay_one(record, dataclasses.replace(EXACT, name="other")).verdict == OK
    # A known hang defect covering the case: not run either, whatever the file records.
    hangs = KnownDefect("never returns (planted)", default_device(), lambda case: case.seq_k == 5,
                        "planted.json", check="hang")
    declaring = dataclasses.replace(EXACT, name="declaring",
                                    caps=dataclasses.replace(EXACT.caps, known_defects=(hangs,)))
    plain = dataclasses.replace(load(path), expected_failures={})
    outcome = replay_one(plain, declaring, judge_fn=_never_called)
    assert outcome.verdict == XFAIL and "its known defect (planted.json)" in outcome.message


# -- gate ---------------------------------------------------------------------------------------
@pytest.fixture
def replay_only(monkeypatch):
    """The gate with no registered implementation and nothing to fuzz: only the outside ones,
    replayed (as `--changed-since` does for unchanged kernels), so the test runs in seconds."""
    from fuzzattn.cli import changes, common
    monkeypatch.setattr(common, "registered", lambda: [])
    monkeypatch.setattr(changes, "plan", lambda rev, subjects: (set(), []))


def test_gate_passes_and_lists_an_expected_failure(capsys, tmp_path, replay_only):
    directory = tmp_path / "regs"
    _file(directory, {"bottom_right_as_top_left": REASON})
    status, out, err = run(capsys, "gate", "--regressions-dir", directory, "--impl", LEAKY_SPEC,
                           "--markdown", tmp_path / "gate.md")
    assert status == 0, out + err
    assert "gate passed" in out and "1 expected failure(s)" in out
    (row,) = [line for line in out.splitlines() if line.startswith("replay") and "on bottom_right" in line]
    assert "xfail" in row
    assert "| xfail |" in (tmp_path / "gate.md").read_text()


def test_gate_fails_on_xpass_strict(capsys, tmp_path, replay_only):
    directory = tmp_path / "regs"
    _file(directory, {"exact": REASON})
    status, out, _ = run(capsys, "gate", "--regressions-dir", directory, "--impl", EXACT_SPEC)
    assert status == 1
    assert "gate FAILED" in out and "XPASS(strict)" in out


# -- the pytest item ------------------------------------------------------------------------------
def test_pytest_item_is_xfail_and_an_unexpected_pass_fails_strictly(pytester, monkeypatch):
    regressions = pytester.mkdir("regressions")
    _file(regressions, {"bottom_right_as_top_left": REASON, "exact": REASON})
    monkeypatch.delenv("FUZZATTN_REGRESSIONS_DIR", raising=False)
    result = pytester.runpytest_subprocess(
        "regressions", "-v", "-p", "no:cacheprovider", "-p", "fuzzattn.pytest_plugin",
        f"--fuzzattn-impl={LEAKY_SPEC}", f"--fuzzattn-impl={EXACT_SPEC}",
        "-k", "bottom_right_as_top_left or exact")
    result.assert_outcomes(xfailed=1, failed=1)
    result.stdout.fnmatch_lines(["*::bottom_right_as_top_left XFAIL*", "*::exact FAILED*",
                                 "*XPASS(strict): regression file*"])


# -- device-limited entries -------------------------------------------------------------------------
def test_an_entry_for_another_device_is_not_an_expectation_here(tmp_path):
    other = "cpu" if default_device() == "cuda" else "cuda"
    path = _file(tmp_path, {name: dict(REASON, device=other) for name in ("bottom_right_as_top_left", "exact")})
    record = load(path)
    assert record.expected_failures["exact"].device == other
    assert replay_one(record, EXACT).verdict == OK            # must pass, like any regression
    assert replay_one(record, LEAKY).verdict == "FAIL"        # and a failure is a failure
    here = _file(tmp_path / "here", {"bottom_right_as_top_left": dict(REASON, device=default_device())})
    assert replay_one(load(here), LEAKY).verdict == XFAIL


def test_a_bad_device_is_one_line_naming_the_field():
    data = {"schema": 2, "case": CASE.to_dict(),
            "expected_failures": {"sdpa": {"reason": "r", "device": "tpu"}}}
    with pytest.raises(RegressionFileError, match=r"expected_failures.sdpa.device.*'tpu'"):
        parse(data)


def test_entries_without_a_device_are_written_as_before(tmp_path):
    text = _file(tmp_path, {"exact": REASON}).read_text()
    assert json.loads(text)["expected_failures"] == {"exact": REASON}


# -- the repository's cuDNN boolean-mask leak ----------------------------------------------------------
EXPECTED_FILES = [p for p, record in loadable(ROOT / "regressions") if record.expected_failures]
LEAK_FILES = [p for p in EXPECTED_FILES if "sdpa_cudnn" in load(p).expected_failures]


def test_the_leak_is_recorded_for_both_dtypes_and_both_ways_of_reaching_cudnn():
    seen = set()
    assert len(LEAK_FILES) == 2
    for path in LEAK_FILES:
        record = load(path)
        case = record.case
        assert (case.batch, case.heads, case.seq_q, case.seq_k, case.head_dim, case.causal,
                case.scale, case.values) == (1, 1, 2, 5, 128, "bottom_right", 1.0, "large")
        assert record.inputs_sha256 == inputs_sha256(materialize(case))
        assert record.covers and path.name == f"{case.key()}.json"
        assert set(record.expected_failures) == {"sdpa", "sdpa_cudnn"}
        for entry in record.expected_failures.values():
            assert "CUDNN_ATTENTION" in entry.reason and "2.11.0+cu130" in entry.reason
        # No configuration in the case: the default sdpa declares none (always a boolean mask),
        # and sdpa_cudnn runs a case naming none at its default, the boolean mask. The default
        # sdpa fails only where it dispatches to cuDNN; sdpa_cudnn exists only there.
        assert case.config == ()
        assert record.expected_failures["sdpa"].device == "cuda"
        assert record.expected_failures["sdpa_cudnn"].device == ""
        seen.add(case.dtype)
    assert seen == {"bfloat16", "float16"}


def test_every_expected_failure_names_its_cause_upstream_and_device():
    """The upstream defects the H200 campaigns found (benchmarks/REPORT.md): each file pins
    its inputs, is named by its case, and every entry says what fails, where to report it, and
    on which device it was measured."""
    assert len(EXPECTED_FILES) >= 8
    for path in EXPECTED_FILES:
        record = load(path)
        assert record.covers and path.name == f"{record.case.key()}.json"
        assert record.inputs_sha256 == inputs_sha256(materialize(record.case))
        for name, entry in record.expected_failures.items():
            assert "measured on the H200" in entry.reason and entry.upstream, (path.name, name)


@pytest.mark.parametrize("path", EXPECTED_FILES, ids=lambda p: p.name)
def test_the_expected_failure_files_have_a_kernel_to_replay_them_here(path):
    """Their replays are the suite's items `regressions/<file>::<kernel>`: xfail where the file
    expects a failure on this device, else passing (test_fixtures.py checks the collection).
    On the CPU every kernel that runs the case passes (sdpa_cudnn is not registered there)."""
    record = load(path)
    assert any(impl.supports(record.case) for impl in implementations().values()), \
        "some implementation here must run the case"


# -- known upstream defects: the expected failures' input classes, passed over by campaigns ------
def test_each_known_defect_covers_the_file_that_pins_it():
    """A declared known defect is only as wide as its evidence: its regression file expects the
    implementation to fail on that device, and the predicate covers that file's case there
    (and only there)."""
    for impl_name, defects in KNOWN_DEFECTS.items():
        for defect in defects:
            record = load(ROOT / "regressions" / defect.regression)
            assert record.expected_failure(impl_name, defect.device_type), (impl_name, defect.name)
            assert defect.covers(record.case, defect.device_type, gradients=True), defect.name
            assert not defect.covers(record.case, "cpu", gradients=True), defect.name
            # campaigns judge the class and tally the failure the file records to the defect
            assert defect.check == record.check, (defect.name, defect.check, record.check)


@pytest.mark.parametrize("path", EXPECTED_FILES, ids=lambda p: p.name)
def test_every_expected_failure_on_cuda_is_a_declared_known_defect(path):
    """...and every CUDA expected failure is declared, so no campaign there stops on it again."""
    record = load(path)
    for impl_name in record.expected_failures:
        if record.expected_failure(impl_name, "cuda"):
            assert covering(KNOWN_DEFECTS.get(impl_name, ()), record.case, "cuda",
                            gradients=True), (path.name, impl_name)


def _bottom_right_as_top_left(q, k, v, *, causal, scale):
    return sdpa_forward(q, k, v, causal="top_left" if causal else False, scale=scale)


def test_a_campaign_passes_over_a_known_defect_and_counts_it():
    """The declared class is not judged and is counted, never as a pass; the same bug
    undeclared is found (so the first campaign's pass is not for lack of drawing it)."""
    here = torch.device(default_device()).type
    caps = Capabilities(dtypes={"float32"}, head_dims={16}, causal=("top_left", "bottom_right"))
    defect = KnownDefect("bottom-right treated as top-left", here,
                         lambda case: case.causal == "bottom_right", "example.json")
    known = Implementation("known", _bottom_right_as_top_left,
                           dataclasses.replace(caps, known_defects=(defect,)))
    strategy = attention_cases(known.caps, profile=PROFILES["ci"])
    result = fuzz(known, strategy, max_examples=60, save_to_file=False)
    assert result.passed, result.counterexample
    assert result.refused[defect.summary()] > 0 and result.cases > 0
    assert "% of draws passed over: known upstream defect (example.json)" in result.refusal_note()
    relation = RELATIONS["causal_prefix"](known, AttentionCase(1, 1, 1, 3, 5, 16,
                                                               causal="bottom_right"))
    assert relation is None                       # relations pass over it too
    unknown = Implementation("unknown", _bottom_right_as_top_left, caps)
    found = fuzz(unknown, attention_cases(caps, profile=PROFILES["ci"]), max_examples=60,
                 save_to_file=False)
    assert found.counterexample is not None
