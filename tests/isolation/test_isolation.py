"""Isolated judging: a kernel that hangs, kills its process or faults the device becomes a
verdict, is shrunk like any failure, and leaves the campaign able to go on.

Workers are shared across the tests of this module (one per kernel, per xdist worker process),
and on a CPU-only machine a worker is forked from a fork server that has imported torch already,
so a restart after a hang or a death costs milliseconds, not the seconds an import costs. The
campaigns draw from a deliberately small strategy: one batch and head, seq_q in 1..12 (the bug
threshold is 5), seq_k in 1..3; plain integers shrink straight to the threshold.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from hypothesis import strategies as st

from fuzzattn import AttentionCase, Implementation
from fuzzattn.campaigns.campaign import Counterexample, check_case, fuzz
from fuzzattn.isolation.supervisor import IsolatedJudge, IsolationError, is_device_fault, spec_of
from fuzzattn.run.loader import load_implementation
from fuzzattn.judging.verdict import CHECKS

KERNELS = Path(__file__).resolve().parents[1] / "isolation_kernels.py"
THRESHOLD = 5
TIMEOUT = 0.5          # per case, for the hanging kernel; the others never get near theirs
GENEROUS = 60.0


def kernel(name: str) -> Implementation:
    # probe=False: the loader's probe runs at seq_q=16, past every kernel's threshold.
    return load_implementation(f"{KERNELS}:{name}", probe=False)


def case(seq_q: int, seq_k: int = 2) -> AttentionCase:
    return AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=seq_q, seq_k=seq_k, head_dim=16)


SMALL = st.builds(AttentionCase, batch=st.just(1), heads=st.just(1), kv_heads=st.just(1),
                  seq_q=st.integers(1, 12), seq_k=st.integers(1, 3), head_dim=st.just(16))

# kernel -> (expected check, words its detail must contain, per-case timeout)
BAD = {
    "HANG": ("hang", [f"no result after {TIMEOUT:g} s", "hang_at_5"], TIMEOUT),
    "SEGFAULT": ("segfault", ["SIGSEGV", "segfault_at_5"], GENEROUS),
    "DEVICE_FAULT": ("device_fault", ["illegal memory access"], GENEROUS),
}


@pytest.fixture(scope="module")
def worker():
    """worker(name) -> the module's IsolatedJudge for that kernel, started on first use."""
    opened: dict[str, IsolatedJudge] = {}

    def get(name: str) -> IsolatedJudge:
        if name not in opened:
            opened[name] = IsolatedJudge(kernel(name), timeout=BAD.get(name, (0, 0, GENEROUS))[2])
        return opened[name]

    yield get
    for isolated in opened.values():
        isolated.close()


def test_new_checks_sit_with_crash():
    i = CHECKS.index("crash")
    assert CHECKS[i + 1:i + 4] == ("device_fault", "segfault", "hang")


@pytest.mark.parametrize("name", sorted(BAD))
def test_verdict_then_a_fresh_worker(name, worker):
    check, words, timeout = BAD[name]
    isolated = worker(name)
    starts = isolated.stats.starts
    assert isolated.judge(case(THRESHOLD - 1)).passed
    start = time.perf_counter()
    judged = isolated.judge(case(THRESHOLD))
    elapsed = time.perf_counter() - start
    assert [v.check for v in judged.failures] == [check], judged.describe()
    for word in words:
        assert word in judged.first_failure.detail
    # what a regression file needs, though the worker that judged it is gone
    assert judged.inputs_sha256 and judged.versions and judged.cli_name == f"{KERNELS}:{name}"
    # The next call gets a new worker transparently, and judges correctly again.
    assert isolated.judge(case(THRESHOLD - 1)).passed
    assert isolated.stats.starts == starts + 1
    if check == "hang":
        # the timeout, the stack dump (<= 0.5 s) and SIGTERM; not the replacement's start-up
        # (~6 s on a GPU host, see `restart` below). 4 s over the timeout leaves a loaded host
        # room for the dump and the signal and still tells the two apart.
        assert TIMEOUT <= elapsed < TIMEOUT + 4.0


def test_a_device_fault_in_the_backward_replaces_the_worker(worker):
    """A CUDA error is sticky: the worker whose backward raised one must not judge the next case
    (on the H200 three regression files after an SDPA backward fault failed in the old worker)."""
    isolated = worker("BACKWARD_DEVICE_FAULT")
    assert isolated.judge(case(THRESHOLD - 1)).passed
    starts = isolated.stats.starts
    judged = isolated.judge(case(THRESHOLD))
    assert [v.check for v in judged.failures] == ["device_fault"], judged.describe()
    assert judged.first_failure.detail.startswith("in the backward: ")
    assert "misaligned address" in judged.first_failure.detail
    assert isolated.stats.starts == starts + 1 and isolated.stats.device_faults == 1
    assert isolated.judge(case(THRESHOLD - 1)).passed


def test_a_context_left_faulted_pins_the_fault_on_the_case_that_left_it(worker):
    """The worker checks its CUDA context after each judgement (isolation_worker.context_fault):
    on the H200, SDPA's fp16 backward raised an error that does not say CUDA and left the context
    faulted, and the next file judged in that worker failed with 'misaligned address'. What the
    supervisor makes of such a report: the case's crash becomes its device_fault, or a
    device_fault is added to a case that otherwise passed; the worker is replaced either way."""
    from fuzzattn.isolation.worker import context_fault
    from fuzzattn.judgement.judge import JudgedCase
    from fuzzattn.judging.verdict import Verdict
    assert context_fault("cpu") is None
    isolated = worker("CORRECT")
    here = case(THRESHOLD - 1)
    fault = "AcceleratorError: CUDA error: misaligned address"
    crashed = JudgedCase("correct", here, [
        Verdict(impl="correct", case=here, check="out", passed=True),
        Verdict(impl="correct", case=here, check="grad_crash", passed=False,
                detail="backward raised: RuntimeError: cuDNN error: EXECUTION_FAILED")])
    faults, starts = isolated.stats.device_faults, isolated.stats.starts
    faulted = isolated._classify(crashed, left_faulted=fault)
    assert [v.check for v in faulted.failures] == ["device_fault"]
    assert faulted.first_failure.detail.startswith("in the backward: backward raised")
    assert f"left faulted: {fault}" in faulted.first_failure.detail
    assert faulted.inputs_sha256 and faulted.versions
    quiet = JudgedCase("correct", here, [Verdict(impl="correct", case=here, check="out", passed=True)])
    faulted = isolated._classify(quiet, left_faulted=fault)
    assert [v.check for v in faulted.verdicts] == ["out", "device_fault"]
    assert faulted.first_failure.detail.startswith("after the call; the CUDA context was left faulted")
    assert isolated.stats.device_faults == faults + 2
    assert isolated.judge(here).passed and isolated.stats.starts == starts + 2
    # Without a faulted context, a crash that does not say CUDA stays a crash.
    assert isolated._classify(crashed) is crashed


@pytest.mark.parametrize("name", sorted(BAD))
def test_campaign_shrinks_to_the_threshold_and_saves_it(name, worker, tmp_path):
    check = BAD[name][0]
    result = fuzz(kernel(name), SMALL, max_examples=30, hypothesis_seed_value=0,
                  regressions_dir=tmp_path, judge_fn=worker(name).judge)
    found = result.counterexample
    assert found is not None, result
    assert found.judged.first_failure.check == check
    assert (found.judged.case.seq_q, found.judged.case.seq_k) == (THRESHOLD, 1)
    saved = json.loads(found.path.read_text())
    assert found.path.parent == tmp_path
    assert saved["check"] == check and saved["case"]["seq_q"] == THRESHOLD
    assert saved["impl_spec"] == f"{KERNELS}:{name}" and saved["inputs_sha256"]


def test_a_death_once_does_not_end_the_run(tmp_path, monkeypatch):
    """An implementation that kills its process once (at seq_q == 7) and then passes: that case
    is a segfault counterexample (not rerun as flaky: each rerun would cost a worker), and every
    later case is judged, in a new worker that sees the caller's environment, and passes."""
    monkeypatch.setenv("FUZZATTN_TEST_ONCE", str(tmp_path / "died"))
    impl = kernel("ABORT_ONCE")
    outcomes = []
    with IsolatedJudge(impl, timeout=GENEROUS) as isolated:
        for n in (6, 7, 8, 7, 9):
            try:
                check_case(impl, case(n), regressions_dir=tmp_path / "files",
                           judge_fn=isolated.judge)
                outcomes.append("ok")
            except Counterexample as found:
                outcomes.append(found.judged.first_failure.check)
        assert isolated.stats.starts == 2
    # the second seq_q=7 is the memo's answer: one verdict per case per process
    assert outcomes == ["ok", "segfault", "ok", "segfault", "ok"]
    assert len(list((tmp_path / "files").glob("*.json"))) == 1


def test_a_per_shape_compiler_gets_the_first_call_deadline_for_each_new_shape(tmp_path, monkeypatch):
    """Declaring `compiles_per_shape`, each shape's first case in a worker may take as long as a
    compile (flight.FIRST_CALL), later cases of the shape the timeout: a hang is still a hang.
    A worker started after one has compiled nothing. Undeclared, the compile is a hang."""
    import dataclasses
    hang = tmp_path / "hang"
    monkeypatch.setenv("FUZZATTN_TEST_HANG", str(hang))
    with IsolatedJudge(kernel("COMPILING"), timeout=TIMEOUT) as isolated:
        assert isolated.judge(case(3)).passed                         # compiles: 1.5 s
        assert isolated.judge(dataclasses.replace(case(3), data_seed=1)).passed
        assert isolated.judge(case(5)).passed                         # a new shape compiles
        hang.touch()
        hung = isolated.judge(dataclasses.replace(case(5), data_seed=1))
        assert hung.first_failure.check == "hang", hung.describe()
        assert f"no result after {TIMEOUT:g} s" in hung.first_failure.detail
        hang.unlink()
        assert isolated.judge(dataclasses.replace(case(3), data_seed=2)).passed   # new worker
        assert isolated.stats.starts == 2
    with IsolatedJudge(kernel("COMPILING_UNDECLARED"), timeout=TIMEOUT) as isolated:
        assert isolated.judge(case(3)).first_failure.check == "hang"


def test_timeout_bounds_a_campaign_against_a_hanging_kernel(tmp_path):
    """fuzz(isolate=True): with a time cap of `seconds`, the campaign may overrun it by at most
    the case in flight and Hypothesis's final replay, each a timeout plus a (forked) restart.
    In-process this campaign would never return."""
    seconds = 1.0
    # seq_k 4..6: cases no other test judged, so the per-process memo answers none of them
    fresh = st.builds(AttentionCase, batch=st.just(1), heads=st.just(1), kv_heads=st.just(1),
                      seq_q=st.integers(1, 12), seq_k=st.integers(4, 6), head_dim=st.just(16))
    start = time.perf_counter()
    # Not stopping at the first hang: found before the cap on a fast machine, it would end the
    # campaign there, and the cap this test bounds would never be reached.
    result = fuzz(kernel("HANG"), fresh, max_examples=1000, seconds=seconds,
                  hypothesis_seed_value=0, regressions_dir=tmp_path, isolate=True, timeout=TIMEOUT,
                  stop_at_first=False)
    elapsed = time.perf_counter() - start
    assert result.counterexample.judged.first_failure.check == "hang"
    assert result.budget_hit
    # A restart is a fork from the fork server (isolation._context: milliseconds), which on a GPU
    # host then creates its own CUDA context and judges a warm-up case on it.
    restart = 6.0 if torch.cuda.is_available() else 1.5
    assert result.seconds < seconds + 3 * (TIMEOUT + restart), result.seconds
    assert elapsed < 60, elapsed      # the one worker start (the fork server's, if first) included


def test_timeout_needs_isolation():
    with pytest.raises(ValueError, match="isolate=True"):
        fuzz(kernel("CORRECT"), SMALL, max_examples=1, timeout=1.0)


def test_worker_start_failure_is_an_error():
    with pytest.raises(IsolationError, match="could not start"):
        IsolatedJudge(f"{KERNELS}:NO_SUCH_NAME", timeout=1)


@pytest.mark.parametrize("message, falls_back", [
    ("CUDA error: initialization error (simulated)", True), ("an unrelated error", False)])
def test_a_gpu_host_spawns_workers_once_a_forked_one_cannot_start_cuda(
        tmp_path, monkeypatch, message, falls_back):
    """isolation/starting.py: a forked worker that fails to start on a CUDA host with a CUDA error
    sends that process back to spawned workers (the same failure then raises: nothing is hidden);
    any other start failure is the kernel's and changes nothing."""
    from fuzzattn.isolation import starting
    (tmp_path / "broken.py").write_text(f"raise RuntimeError({message!r})\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(starting, "fork_failed_on_cuda", False)
    assert starting.context().get_start_method() == "forkserver"
    with pytest.raises(IsolationError, match="could not start"):
        IsolatedJudge(f"{tmp_path / 'broken.py'}:ANY", timeout=5, device="cpu")
    assert starting.fork_failed_on_cuda is falls_back
    assert starting.context().get_start_method() == ("spawn" if falls_back else "forkserver")


def test_spec_of_names_what_a_worker_can_import():
    from fuzzattn.run.registry import get
    assert spec_of(get("sdpa")) == "sdpa"
    assert spec_of(kernel("HANG")) == f"{KERNELS}:HANG"
    local = Implementation(name="local", fn=lambda q, k, v, *, causal, scale: None)
    with pytest.raises(IsolationError, match="not a module attribute"):
        spec_of(local)


def test_device_fault_texts():
    for text in ("RuntimeError: CUDA error: an illegal memory access was encountered",
                 "AcceleratorError: CUDA error: device-side assert triggered",
                 "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered"):
        assert is_device_fault(text)
    assert not is_device_fault("RuntimeError: shapes cannot be multiplied")


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="needs a CUDA GPU: a real illegal memory access from a Triton store")
def test_real_device_fault_from_a_triton_kernel(tmp_path):
    impl = kernel("TRITON_OOB")
    with IsolatedJudge(impl, timeout=120, device="cuda") as isolated:
        assert isolated.judge(case(THRESHOLD - 1)).passed
        judged = isolated.judge(case(THRESHOLD))
        assert judged.first_failure.check == "device_fault", judged.describe()
        assert "illegal memory access" in judged.first_failure.detail
        assert isolated.judge(case(THRESHOLD - 1)).passed    # a fresh, unpoisoned context
    result = fuzz(impl, SMALL, max_examples=30, hypothesis_seed_value=0, regressions_dir=tmp_path,
                  device="cuda", isolate=True, timeout=120)
    assert result.counterexample.judged.first_failure.check == "device_fault"
    assert result.counterexample.judged.case.seq_q == THRESHOLD


# -- the command line and the pytest plugin ---------------------------------------------------------
def test_cli_fuzz_isolated_finds_a_segfault_and_its_replay_hint_replays_it(tmp_path, capsys):
    """The probe call at seq_q=16 would kill the CLI in-process; isolated, the probe runs in a
    worker and the campaign finds the segfault. The file it writes records `segfault`, so the
    printed replay command (no isolation option) replays it in a worker: exit 1, same check,
    and this process is still here to say so."""
    from fuzzattn.cli import main
    code = main(["fuzz", "--impl", f"{KERNELS}:SEGFAULT", "--isolate", "--timeout", "60", "--seconds", "5",
                 "--max-examples", "20", "--profile", "ci", "--regressions-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "segfault" in out and "worker died with SIGSEGV" in out
    assert "--timeout 60" in out                # the "found by" line keeps the isolation
    (written,) = tmp_path.glob("*.json")
    hint = next(line for line in out.splitlines() if line.strip().startswith("replay:"))
    argv = hint.split("replay:", 1)[1].split()
    assert argv[:2] == ["fuzzattn", "replay"] and f"{KERNELS}:SEGFAULT" in argv
    code = main(argv[1:])
    replayed = capsys.readouterr().out
    assert code == 1, replayed
    assert "segfault" in replayed and "1 failed" in replayed


def test_pytest_isolate_fails_the_hanging_test_and_runs_on(pytester):
    """--fuzzattn-timeout: check_case on the run's implementations goes through a worker; the
    hanging case is one failed test with the `hang` verdict, and the next test still runs."""
    pytester.makepyfile(test_hangs=f"""
        from fuzzattn import AttentionCase
        from fuzzattn.campaigns.campaign import check_case
        from fuzzattn.settings import outside_implementations

        def test_hangs():
            (impl,) = outside_implementations()
            check_case(impl, AttentionCase(1, 1, 1, {THRESHOLD}, 3, 16), save_to_file=False)

        def test_runs_after():
            (impl,) = outside_implementations()
            check_case(impl, AttentionCase(1, 1, 1, {THRESHOLD - 1}, 3, 16), save_to_file=False)
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "fuzzattn.pytest_plugin",
                                f"--fuzzattn-impl={KERNELS}:HANG", f"--fuzzattn-timeout={TIMEOUT}",
                                "test_hangs.py")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*isolated: one worker process per implementation*",
                                 f"*hang_at_5 hang: no result after {TIMEOUT:g} s*"])
