"""Safe by default: the installed command judges in a watched child process, so a kernel that
hangs or kills the process loses no case (fuzzattn/isolation/watchdog.py, fuzzattn/cli/watched.py,
fuzzattn/platform/flight.py)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fuzzattn.contract.case import AttentionCase
from fuzzattn.platform import flight

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "tests" / "isolation_kernels.py"
TIMEOUT = 3          # seconds a call may take in these tests before it is a hang
START_UP = 90        # seconds allowed for the child's imports on a loaded CI machine


def user_env(extra=None) -> dict:
    """This environment without what marks a process as part of a pytest-xdist run or of a
    watched run: what a user's shell has."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_XDIST", "FUZZATTN_SUPERVISED", "FUZZATTN_FLIGHT"))
           and k != "PYTEST_CURRENT_TEST"}
    return {**env, **(extra or {})}


def fuzzattn(*args, cwd, env=None):
    """The installed command, as a user runs it (watched by default)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "fuzzattn.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=600, env=user_env(env))
    return done, time.monotonic() - started


def leftovers(marker: str) -> list[str]:
    """Command lines of live processes that mention `marker` (a test's private directory)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline:
                found.append(cmdline)
    return found


def saved(directory: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def replay_line(out: str) -> str:
    return re.search(r"replay:\s+fuzzattn (.+)", out).group(1)


# -- the flight record ----------------------------------------------------------------------------
def test_the_flight_record_names_the_call_in_flight_and_its_deadline(tmp_path):
    path = str(tmp_path / "flight")
    flight.create(path)
    assert flight.read(path) is None
    recorder = flight.Recorder(path, timeout=7.0)
    recorder.context = {"dtype": "float32"}
    case = AttentionCase(batch=1, heads=2, kv_heads=1, seq_q=5, seq_k=9, head_dim=16)

    class Impl:
        name, cli_name = "demo", "demo.py:DEMO"

    recorder.begin(Impl, case, "forward")
    record = flight.read(path)
    assert record.in_flight and not record.faulted
    assert record["timeout"] == 7.0 and record["deadline"] > time.monotonic()
    assert AttentionCase.from_dict(record["case"]) == case
    assert (record["spec"], record["stage"], record["context"]) == ("demo.py:DEMO", "forward",
                                                                      {"dtype": "float32"})
    recorder.end(Impl, case)
    assert not flight.read(path).in_flight


def test_a_derived_deadline_grows_with_the_case_and_never_falls_below_the_floor():
    speeds = flight.Speeds()
    small = AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=8, seq_k=8, head_dim=16)
    huge = AttentionCase(batch=64, heads=32, kv_heads=32, seq_q=4096, seq_k=4096, head_dim=128)
    assert speeds.timeout("k", small) == flight.FIRST_CALL       # nothing measured yet
    speeds.note("k", small, 0.001)
    assert speeds.timeout("k", small) == flight.FLOOR
    assert speeds.timeout("k", huge) > 100 * flight.FLOOR        # 0.001 s per 2^16 MACs, scaled
    assert speeds.timeout("other", small) == flight.FIRST_CALL



def test_a_per_shape_compiler_gets_the_first_call_deadline_on_each_new_shape():
    """torch.compile'd kernels compile again for every shape: a compile is not a hang."""
    import dataclasses
    speeds = flight.Speeds()
    case = AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=8, seq_k=8, head_dim=16)
    speeds.note("flex", case, 0.001)
    per_shape = dict(compiles_per_shape=True, stage="forward")
    assert speeds.timeout("flex", case, **per_shape) == flight.FIRST_CALL      # compiles
    assert speeds.timeout("flex", case, **per_shape) == flight.FLOOR           # compiled
    assert speeds.timeout("flex", dataclasses.replace(case, data_seed=7), **per_shape) == flight.FLOOR
    assert speeds.timeout("flex", dataclasses.replace(case, seq_k=9), **per_shape) == flight.FIRST_CALL
    assert speeds.timeout("flex", case, compiles_per_shape=True, stage="backward") == flight.FIRST_CALL
    assert speeds.timeout("flex", dataclasses.replace(case, seq_q=9)) == flight.FLOOR   # not declared

# -- the command, watched -------------------------------------------------------------------------
def test_a_hanging_kernel_is_saved_as_a_hang_with_no_flag(tmp_path):
    done, seconds = fuzzattn("fuzz", "--impl", f"{KERNELS}:HANG", "--max-examples", 30,
                             "--timeout", TIMEOUT, "--regressions-dir", tmp_path / "reg",
                             cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert seconds < 2 * TIMEOUT + START_UP, seconds
    assert "hang: no result from the forward call after 3 s" in out, out
    assert "isolation_kernels.py:54 in hang_at_5" in out          # where it stood
    [record] = saved(tmp_path / "reg")
    assert record["check"] == "hang" and record["case"]["seq_q"] >= 5
    assert leftovers(str(tmp_path)) == []
    # The printed replay reproduces it, in a worker process.
    again, _ = fuzzattn(*replay_line(out).split(), cwd=tmp_path)
    assert again.returncode == 1 and "hang" in again.stdout, again.stdout + again.stderr
    assert leftovers(str(tmp_path)) == []


SEGFAULT_LATER = '''
import ctypes
import torch
from fuzzattn import Capabilities, Implementation

def attention(q, k, v, *, causal, scale):
    if q.shape[2] >= 3 and k.shape[2] % 2 == 1:        # passes the probe (16 x 16), not the search
        ctypes.string_at(0)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)

ODD_KEYS = Implementation("odd_keys", attention, Capabilities(dtypes={"float32"}, head_dims={16},
                                                             causal=("top_left",)))
'''


def test_a_segfault_is_saved_then_shrunk_isolated(tmp_path):
    (tmp_path / "odd.py").write_text(SEGFAULT_LATER)
    done, seconds = fuzzattn("fuzz", "--impl", "odd.py:ODD_KEYS", "--max-examples", 40,
                             "--regressions-dir", "reg", cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "segfault: the process died with SIGSEGV at odd.py:8 in attention" in out, out
    assert "shrinking the segfault isolated" in out and "shrunk to" in out, out
    assert "--database off" in out.split("shrinking the segfault isolated")[1].splitlines()[0], out
    [record] = saved(tmp_path / "reg")                  # the shrunk case replaced the found one
    assert record["check"] == "segfault"
    case = record["case"]
    assert (case["seq_q"], case["seq_k"] % 2, case["batch"], case["heads"]) == (3, 1, 1, 1)
    assert leftovers(str(tmp_path)) == []
    again, _ = fuzzattn(*replay_line(out.split("shrunk to")[0]).split()[:1],
                        "reg/" + next((tmp_path / "reg").glob("*.json")).name,
                        "--impl", "odd.py:ODD_KEYS", cwd=tmp_path)
    assert again.returncode == 1 and "segfault" in again.stdout, again.stdout + again.stderr


def test_keep_going_carries_on_isolated_after_a_crash(tmp_path):
    """The crash is shrunk once, by the isolated run that carries on (each try that crashes
    restarts a worker), and its shrunk file is the one file kept: the case as found, saved by
    the watched run, is removed."""
    (tmp_path / "odd.py").write_text(SEGFAULT_LATER)
    done, _ = fuzzattn("fuzz", "--impl", "odd.py:ODD_KEYS", "--impl", "sdpa", "--dtype", "float32",
                       "--max-examples", 20, "--regressions-dir", "reg", "--keep-going",
                       cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "carrying on, isolated" in done.stderr
    assert "shrinking the segfault isolated" not in out, out
    table = done.stdout.split("fuzzattn fuzz: profile=")[-1]      # the isolated run's table
    assert table.splitlines()[0].endswith("isolated"), table
    assert re.search(r"odd_keys\s+float32\s+FAIL", table) and re.search(r"sdpa\s+float32\s+ok", table)
    [record] = saved(tmp_path / "reg")
    case = record["case"]
    assert record["check"] == "segfault" and (case["seq_q"], case["seq_k"] % 2) == (3, 1), record


@pytest.mark.parametrize("signum, status", [(2, 130), (15, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_command_prints_its_table_and_leaves_no_process_behind(tmp_path, signum, status):
    (tmp_path / "slow.py").write_text(
        "import time\nimport torch.nn.functional as F\n"
        "from torch.nn.attention import SDPBackend, sdpa_kernel\n"
        "def slow(q, k, v, *, causal, scale):\n"
        "    time.sleep(0.05)                  # 100,000 cases: still running when stopped\n"
        "    with sdpa_kernel(SDPBackend.MATH):    # no fused kernel's own defects on a GPU\n"
        "        return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), scale=scale)\n")
    child = subprocess.Popen([sys.executable, "-m", "fuzzattn.cli", "fuzz", "--impl", "slow.py:slow",
                              "--dtype", "float32", "--max-examples", "100000",
                              "--regressions-dir", str(tmp_path / "reg")], cwd=tmp_path, env=user_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in child.stdout:                 # a progress line every 10 s: the campaign is running
        seen.append(line)
        if " judged " in line:
            break
    child.send_signal(signum)
    out = "".join(seen) + child.communicate(timeout=120)[0]
    assert child.returncode == status, out
    assert "stopped by" in out and "impl" in out.split(" judged ")[-1], out     # the table so far
    assert leftovers(str(tmp_path)) == [] and not (tmp_path / "reg").exists()


# -- pytest, watched -------------------------------------------------------------------------------
def pytest_run(*args, cwd, env=None):
    """pytest from the command line, with this repository's conftest (the plugin opted in)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *map(str, args)],
                          cwd=cwd, capture_output=True, text=True, timeout=600, env=user_env(env))
    return done, time.monotonic() - started


def test_pytest_saves_a_hang_with_no_flag(tmp_path):
    done, seconds = pytest_run("tests/kernels/test_differential.py", "-k", "hang_at_5",
                               "--fuzzattn-impl", f"{KERNELS}:HANG",
                               "-o", f"fuzzattn_regressions={tmp_path}", cwd=ROOT,
                               env={flight.TIMEOUT_ENV: str(TIMEOUT)})
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert seconds < 2 * TIMEOUT + START_UP, seconds
    assert "hang: no result from the forward call after 3 s" in out, out
    [record] = saved(tmp_path)
    assert record["check"] == "hang"
    assert leftovers(str(tmp_path)) == []


def test_pytest_under_xdist_saves_a_segfault_and_runs_the_rest(tmp_path):
    (tmp_path / "odd.py").write_text(SEGFAULT_LATER)
    done, _ = pytest_run("-n", 2, "tests/kernels/test_differential.py", "-k", "odd_keys or sdpa_math",
                         "--fuzzattn-impl", f"{tmp_path / 'odd.py'}:ODD_KEYS",
                         "--fuzzattn-max-examples", 40, "-o", f"fuzzattn_regressions={tmp_path / 'reg'}",
                         cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert re.search(r"segfault: the process died at odd.py:8 in attention", out), out
    assert re.search(r"\d+ passed", out), out                # sdpa_math's tests ran on
    assert [r["check"] for r in saved(tmp_path / "reg")] == ["segfault"]
    assert leftovers(str(tmp_path / "odd.py")) == []


# -- --isolate with real declarations --------------------------------------------------------------
RULED = '''
import torch
from fuzzattn import Capabilities, Implementation

def attention(q, k, v, *, causal, scale, config):
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)

def block_fits(config, case):
    return None if config["BLOCK"] <= case.head_dim else "BLOCK is wider than D"

RULED = Implementation("ruled", attention, Capabilities(
    dtypes={"float32"}, head_dims={16, 32}, causal=("top_left",),
    configs={"BLOCK": (16, 32)}, config_rule=block_fits))
'''


@pytest.mark.parametrize("option", [("--isolate",), ("--timeout", "30")], ids=["isolate", "timeout"])
def test_isolate_or_timeout_loads_a_declaration_with_a_config_rule(tmp_path, option):
    """--timeout alone is the watching parent's deadline; the campaign in the child runs as usual."""
    (tmp_path / "ruled.py").write_text(RULED)
    done, _ = fuzzattn("fuzz", "--impl", "ruled.py:RULED", "--max-examples", 8, *option,
                       "--no-save", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"ruled\s+float32\s+ok\s+8", done.stdout), done.stdout


@pytest.mark.parametrize("option", [("--isolate",), ("--timeout", "60")], ids=["isolate", "timeout"])
def test_isolate_or_timeout_loads_an_autotune_declare_declaration(tmp_path, option):
    """examples/square_fp16_attention.py declares its @triton.autotune list with autotune.declare
    (a closure as its configuration rule): isolated or watched with a timeout, it loads, and its
    seeded bug is found."""
    example = ROOT / "examples" / "square_fp16_attention.py"
    done, _ = fuzzattn("fuzz", "--impl", f"{example}:SQUARE_FP16", "--max-examples", 5,
                       *option, "--no-save", cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "fuzzattn: error" not in out, out
    assert re.search(r"square_fp16\s+float16\s+FAIL", out) and "BLOCK_N" in out, out


def test_mutants_take_a_timeout_without_isolation(tmp_path):
    done, _ = fuzzattn("mutants", "--only", "mutant_phantom_keys", "--timeout", "30",
                       "--max-examples", 30, "--profile", "ci", cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "timeout needs isolate" not in out, out
    assert re.search(r"mutant_phantom_keys\s+killed", out), out


def test_a_mutant_that_crashes_the_process_is_killed_and_the_zoo_goes_on(tmp_path):
    """Watched, a crash ends the process with every campaign after it unjudged: the command runs
    again isolated, where the crash is the mutant's kill, and nothing is saved."""
    (tmp_path / "odd.py").write_text(SEGFAULT_LATER)
    done, _ = fuzzattn("mutants", "--impl", "odd.py:ODD_KEYS", "--only", "mutant_phantom_keys",
                       "--max-examples", 30, "--profile", "ci", cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "ended the process (segfault); judging again isolated" in out, out
    assert re.search(r"odd_keys\s+killed\s+float32\s+\d+\s+\d+\s+\S+\s+segfault", out), out
    assert re.search(r"mutant_phantom_keys\s+killed", out), out
    assert "regression file:" not in out, out
    assert leftovers(str(tmp_path)) == []


@pytest.mark.parametrize("spec, check, detail", [
    ("odd.py:ODD_KEYS", "segfault", "segfault: the process died with SIGSEGV at odd.py:8 in attention"),
    (f"{KERNELS}:HANG", "hang", "hang: no result from the forward call after 3 s"),
], ids=["segfault", "hang"])
def test_the_gate_saves_a_crash_or_a_hang_with_no_flag(tmp_path, spec, check, detail):
    """The pre-merge gate is watched too: the outside kernel's crash or hang is saved and named."""
    (tmp_path / "odd.py").write_text(SEGFAULT_LATER)
    done, _ = fuzzattn("gate", "--impl", spec, "--allow-empty", "--budget", 30, "--workers", 1,
                       "--timeout", TIMEOUT, "--regressions-dir", "reg", cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert detail in out, out
    [record] = saved(tmp_path / "reg")
    assert record["check"] == check, record
    assert leftovers(str(tmp_path)) == []


_FAILS_ON = "q.shape[2] >= 3 and k.shape[2] % 2 == 1"      # where SEGFAULT_LATER crashes
assert _FAILS_ON in SEGFAULT_LATER

# Sleeps forever where SEGFAULT_LATER crashes: past the probe, so the hang is met by a worker.
HANG_LATER = SEGFAULT_LATER.replace("import ctypes\n", "import time\n").replace(
    "ctypes.string_at(0)", "time.sleep(3600)")


@pytest.mark.parametrize("source, check", [
    (SEGFAULT_LATER, "segfault"),
    pytest.param(HANG_LATER, "hang", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="the gate's other campaigns compile on a GPU, past the "
                                          "3 s deadline a hang needs here to be found quickly")),
], ids=["segfault", "hang"])
def test_the_gate_carries_on_past_a_crash_in_a_worker_and_saves_it(tmp_path, source, check):
    """Over --workers, a worker's crash or hang ends that campaign (its pool's other workers are
    stopped with it) and the gate goes on to the next one: it prints its whole table and exits 1,
    and the crash is saved after it. A worker stopped with the pool mid-call is no finding: every
    file saved records a case the kernel really fails on. The kernel fails on every case but the
    probe's: a GPU host under load judged one case of its ~2 s share, passing. The one file it
    replays first crashes it too, in a worker: that is its failing row, and nothing is saved for
    it (its case is a file already)."""
    (tmp_path / "odd.py").write_text(source.replace(_FAILS_ON, "(q.shape[2], k.shape[2]) != (16, 16)"))
    (tmp_path / "reg").mkdir()
    shipped = {name: (ROOT / "regressions" / name).read_bytes()
               for name in ("5982e80801ec.json",)}
    for name, data in shipped.items():
        (tmp_path / "reg" / name).write_bytes(data)
    deadline = ["--timeout", TIMEOUT] if check == "hang" else []
    done, _ = fuzzattn("gate", "--impl", "odd.py:ODD_KEYS", "--budget", 40,
                       "--workers", 2, *deadline, "--regressions-dir", "reg", cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    for name in shipped:
        assert re.search(rf"replay\s+{name} on odd_keys\s+FAIL\s.*{check}", out), out
    assert re.search(r"fuzz\s+odd_keys float32\s+error\s.*a worker process died", out), out
    assert re.search(r"fuzz\s+(?!odd_keys)\S+ \S+\s+ok\s", out), out       # fuzzed after it
    assert "gate FAILED" in out and out.index("gate FAILED") < out.index("regression file:"), out
    assert f"odd_keys {check}:" in out, out
    after = out[out.index("gate FAILED"):]
    assert not any(name in after for name in shipped), after      # the replays' rows say it all
    assert {name: (tmp_path / "reg" / name).read_bytes() for name in shipped} == shipped
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "reg").glob("*.json"))
               if p.name not in shipped]
    assert records and all(r["check"] == check and r["impl"] == "odd_keys" for r in records), records
    for record in records:                  # the kernel fails exactly on these cases
        assert (record["case"]["seq_q"], record["case"]["seq_k"]) != (16, 16), record
    assert leftovers(str(tmp_path)) == []


# -- a device fault surfacing after the call ------------------------------------------------------
FAULT = "AcceleratorError: CUDA error: misaligned address"


def test_a_fault_met_in_the_read_back_ends_the_watched_process_with_its_case(monkeypatch):
    """Kernels are launched unsynchronised, so an asynchronous fault surfaces when their outputs
    are read back. Left there as the case's crash, the next case's first launch met the poisoned
    context outside any call, and the watched run ended on that error with no case saved (seen
    on an H200 with SDPA's misaligned-address fault). The read-back ends the process instead,
    with the case recorded, as a fault raised inside the call does."""
    from fuzzattn.gradients import backward_runs as grad_runs
    from fuzzattn.run import execute, runs
    from fuzzattn.run.registry import implementations

    def fault(*args, **kwargs):
        raise RuntimeError("CUDA error: misaligned address")

    ended = []
    monkeypatch.setattr(execute, "end_on_device_fault", lambda *a: ended.append(a))
    impl, case = implementations()["sdpa"], AttentionCase(1, 1, 1, 3, 5, 16)
    launched = runs.launch(impl, case, "cpu", adversarial=False)
    monkeypatch.setattr(runs, "read_back", fault)
    assert runs.deliver(impl, case, [launched]) is None
    summary = "RuntimeError: CUDA error: misaligned address"
    assert launched.failure.detail == summary
    monkeypatch.setattr(grad_runs, "read_back", fault)
    backward = grad_runs.run_backward(impl, case, "cpu", None, adversarial=False)
    assert backward.failure.check == "grad_crash"
    assert [(i.name, c, stage, text, str(device)) for i, c, stage, text, device in ended] \
        == [("sdpa", case, "forward", summary, "cpu"), ("sdpa", case, "backward", summary, "cpu")]


def test_a_fault_met_anywhere_in_a_judgement_is_that_cases(monkeypatch):
    """A kernel's asynchronous fault can also surface at the next launch, the oracle's, before
    the read-back: the judgement raises, and the watched process ends with the case recorded."""
    from fuzzattn.judgement import judge as judging
    from fuzzattn.run import execute
    from fuzzattn.run.registry import implementations

    def fault(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    ended = []
    monkeypatch.setattr(execute, "end_on_device_fault", lambda *a: ended.append(a))
    monkeypatch.setattr(judging, "_references", fault)
    impl, case = implementations()["sdpa"], AttentionCase(1, 1, 1, 3, 5, 16)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        judging.judge(impl, case, "cpu")
    assert [(i.name, c, stage, text) for i, c, stage, text, _ in ended] == [
        ("sdpa", case, "judging",
         "RuntimeError: CUDA error: an illegal memory access was encountered")]


def test_only_a_watched_process_ends_and_only_on_a_cuda_fault(monkeypatch):
    from fuzzattn.run import execute
    from fuzzattn.run.registry import implementations

    class Record:
        faults = []

        def device_fault(self, impl, case, stage, summary):
            self.faults.append((stage, summary))

    impl, case = implementations()["sdpa"], AttentionCase(1, 1, 1, 3, 5, 16)
    monkeypatch.setattr(flight, "recorder", lambda: None)
    execute.end_on_device_fault(impl, case, "forward", FAULT, "cuda")      # not watched
    monkeypatch.setattr(flight, "recorder", Record)
    execute.end_on_device_fault(impl, case, "forward", FAULT, "cpu")
    execute.end_on_device_fault(impl, case, "forward", "RuntimeError: shape mismatch", "cuda:0")
    assert Record.faults == []
    execute.end_on_device_fault(impl, case, "backward", FAULT, "cuda:0")
    assert Record.faults == [("backward", FAULT)]


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="needs a CUDA GPU: a real illegal memory access from a Triton store")
def test_a_real_device_fault_is_saved_with_no_flag(tmp_path):
    done, _ = fuzzattn("fuzz", "--impl", f"{KERNELS}:TRITON_OOB", "--max-examples", "30",
                       "--regressions-dir", tmp_path, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    (saved,) = tmp_path.glob("*.json")
    record = json.loads(saved.read_text())
    assert record["check"] == "device_fault" and record["case"]["seq_q"] >= 5, record


@pytest.mark.parametrize("alone, kept", [(1, "shrunk"), (0, "found")])
def test_a_shrunk_crash_replaces_the_found_one_only_if_it_crashes_alone(
        tmp_path, monkeypatch, capsys, alone, kept):
    """A worker that judged an out-of-bounds write may die on a later, innocent case, which the
    isolated shrink then shrinks: the shrunk file is kept only if replaying it alone fails."""
    from fuzzattn.cli import watched
    from fuzzattn.isolation import watchdog
    shipped = json.loads((ROOT / "regressions" / "e4bdabec1311.json").read_text())
    shrunk = dict(shipped, impl="odd_keys", check="segfault")
    found = tmp_path / "reg" / "found.json"
    found.parent.mkdir()
    found.write_text(json.dumps(dict(shrunk, case=dict(shipped["case"], data_seed=7))))
    calls = []

    def run_watched(argv, **kw):
        calls.append(argv)
        if "fuzz" in argv:          # the isolated shrink: it writes the shrunk file
            scratch = Path(argv[argv.index("--regressions-dir") + 1])
            (scratch / "shrunk.json").write_text(json.dumps(shrunk))
            return watchdog.Ending(returncode=1)
        return watchdog.Ending(returncode=alone)      # the replay of the shrunk file alone

    monkeypatch.setattr(watchdog, "run_watched", run_watched)
    crash = watchdog.Crash("segfault", "SIGSEGV", {
        "impl": "odd_keys", "spec": "odd.py:ODD_KEYS",
        "context": {"hypothesis_seed": 0, "profile": "dev"}})
    watched.shrink(crash, type("Written", (), {"path": found, "new": True})())
    out = capsys.readouterr().out
    assert len(calls) == 2 and "fuzz" in calls[0] and "replay" in calls[1]
    names = sorted(p.name for p in found.parent.iterdir())
    if kept == "shrunk":
        assert names == ["shrunk.json"] and "shrunk to" in out, out
    else:
        assert names == ["found.json"] and "did not segfault again on its own" in out, out
