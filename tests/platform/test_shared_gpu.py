"""A device fault on a GPU shared through MPS ends the run with an error, never a verdict
(fuzzattn/platform/shared_gpu.py). On the CPU, FUZZATTN_MPS=on stands in for an MPS server and
tests/isolation_kernels.py's DEVICE_FAULT raises the error torch raises after an illegal memory
access."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import strategies as st

from fuzzattn import AttentionCase
from fuzzattn.campaigns.campaign import forget_verdicts, fuzz
from fuzzattn.judgement import judge as judge_module
from fuzzattn.platform import shared_gpu
from fuzzattn.isolation.supervisor import IsolatedJudge
from fuzzattn.judgement.judge import judge
from fuzzattn.run.loader import load_implementation

KERNELS = Path(__file__).resolve().parents[1] / "isolation_kernels.py"
THRESHOLD = 5           # DEVICE_FAULT faults from seq_q = 5 on
SMALL = st.builds(AttentionCase, batch=st.just(1), heads=st.just(1), kv_heads=st.just(1),
                  seq_q=st.integers(1, 12), seq_k=st.integers(1, 3), head_dim=st.just(16))


def kernel(name: str):
    return load_implementation(f"{KERNELS}:{name}", probe=False)


def case(seq_q: int) -> AttentionCase:
    return AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=seq_q, seq_k=2, head_dim=16)


@pytest.fixture
def mps(monkeypatch):
    monkeypatch.setenv(shared_gpu.ENV, "on")
    # Verdicts this worker remembers from judging the same kernel on the same cases without MPS
    # (test_isolation.py's campaigns) would answer the campaign here without judging anything.
    forget_verdicts()


def test_the_setting_and_the_pipe_directory(monkeypatch, tmp_path):
    monkeypatch.setenv(shared_gpu.ENV, "on")
    assert shared_gpu.mps_active()
    monkeypatch.setenv(shared_gpu.ENV, "off")
    assert not shared_gpu.mps_active()
    monkeypatch.setenv(shared_gpu.ENV, "maybe")
    with pytest.raises(ValueError, match="FUZZATTN_MPS='maybe' is not one of auto, on, off"):
        shared_gpu.mps_active()
    # auto: a server is where a CUDA client would look for it, and only with CUDA
    monkeypatch.setenv(shared_gpu.ENV, "auto")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert not shared_gpu.mps_active()
    (tmp_path / "control").touch()
    assert shared_gpu.mps_active() == __import__("torch").cuda.is_available()


def test_without_mps_a_device_fault_is_the_kernels_verdict(monkeypatch):
    monkeypatch.setenv(shared_gpu.ENV, "off")
    judged = judge(kernel("DEVICE_FAULT"), case(THRESHOLD), device="cpu")
    assert [v.check for v in judged.failures] == ["crash"]
    assert "illegal memory access" in judged.first_failure.detail


def test_under_mps_a_device_fault_is_an_error_naming_the_case(mps):
    impl = kernel("DEVICE_FAULT")
    assert judge(impl, case(THRESHOLD - 1), device="cpu").passed       # no fault: judged as ever
    with pytest.raises(shared_gpu.SharedDeviceFault) as raised:
        judge(impl, case(THRESHOLD), device="cpu")
    message = str(raised.value)
    assert "shared through MPS" in message and "illegal memory access" in message
    assert str(case(THRESHOLD)) in message
    # A BaseException: nothing that catches Exception (Hypothesis, a kernel's wrapper) keeps it.
    assert not isinstance(raised.value, Exception)


def test_under_mps_a_fault_surfacing_in_the_harness_is_an_error_too(mps, monkeypatch):
    def faulting(*args, **kwargs):
        raise RuntimeError("CUDA error: the MPS client has been terminated by the server")
    monkeypatch.setattr(judge_module, "_judge", faulting)
    with pytest.raises(shared_gpu.SharedDeviceFault, match="terminated by the server"):
        judge(kernel("CORRECT"), case(2), device="cpu")

    def broken(*args, **kwargs):
        raise KeyError("not a device fault")
    monkeypatch.setattr(judge_module, "_judge", broken)
    with pytest.raises(KeyError):                  # any other error stays what it was
        judge(kernel("CORRECT"), case(2), device="cpu")


def test_a_campaign_under_mps_stops_at_the_fault_and_writes_no_file(mps, tmp_path):
    with pytest.raises(shared_gpu.SharedDeviceFault):
        fuzz(kernel("DEVICE_FAULT"), SMALL, max_examples=40, hypothesis_seed_value=0,
             regressions_dir=tmp_path, device="cpu")
    assert list(tmp_path.iterdir()) == []


def test_isolated_under_mps_the_supervisor_raises_and_the_next_worker_judges(mps):
    with IsolatedJudge(kernel("DEVICE_FAULT"), timeout=60) as isolated:
        assert isolated.judge(case(THRESHOLD - 1)).passed
        with pytest.raises(shared_gpu.SharedDeviceFault, match="illegal memory access"):
            isolated.judge(case(THRESHOLD))
        assert isolated.judge(case(THRESHOLD - 1)).passed       # a fresh worker


def test_cli_exit_status_3_and_one_line(mps, tmp_path, capsys):
    """Isolated (--timeout), as a kernel that may fault is fuzzed: the probe, the campaign's
    judgements in the worker and the supervisor's rule, end to end."""
    from fuzzattn.cli import main
    code = main(["fuzz", "--impl", f"{KERNELS}:DEVICE_FAULT", "--isolate", "--timeout", "60", "--seconds", "20",
                 "--max-examples", "40", "--profile", "ci", "--regressions-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 3, err
    (line,) = [line for line in err.splitlines() if line.startswith("fuzzattn: error:")]
    assert "shared through MPS" in line and "illegal memory access" in line
    assert list(tmp_path.iterdir()) == []


def test_pytest_with_a_bad_setting_is_a_usage_error_before_any_test(pytester, monkeypatch):
    """The plugin checks the environment at configure time, as the CLI does (test_cli.py)."""
    monkeypatch.setenv(shared_gpu.ENV, "maybe")
    pytester.makepyfile("def test_never_runs():\n    assert False\n")
    result = pytester.runpytest_subprocess("-p", "fuzzattn.pytest_plugin")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*FUZZATTN_MPS='maybe' is not one of auto, on, off*"])


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_pytest_stops_the_whole_run_at_the_first_shared_device_fault(pytester, monkeypatch,
                                                                     workers):
    """The plugin turns a test's SharedDeviceFault into the session's stop (session.shouldstop;
    under xdist the controller stops every worker): every later test would meet the same fault,
    and MPS refuses new clients until all of them exited. Forty slow tests follow the faulting
    one; none runs after the fault without xdist, and under xdist the run ends far short of
    them with the stop's reason."""
    monkeypatch.setenv(shared_gpu.ENV, "on")
    pytester.makepyfile(test_fault=f"""
import time

import pytest

from fuzzattn import AttentionCase
from fuzzattn.judgement.judge import judge
from fuzzattn.run.loader import load_implementation

KERNEL = load_implementation({str(KERNELS)!r} + ":DEVICE_FAULT", probe=False)


def test_faults():
    judge(KERNEL, AttentionCase(1, 1, 1, {THRESHOLD}, 2, 16), device="cpu")


@pytest.mark.parametrize("i", range(40))
def test_later(i):
    time.sleep(0.2)     # slow on purpose: 8 s of tests that a stopped run must not get through
""")
    result = pytester.runpytest_subprocess("-p", "fuzzattn.pytest_plugin", "-p", "no:cacheprovider",
                                           *workers)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1, result.stdout.str()[-3000:]
    assert outcomes.get("passed", 0) < (1 if not workers else 20), outcomes
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*Interrupted: fuzzattn: test_fault.py::test_faults: *shared "
                                 "through MPS*the run stops here*"])
