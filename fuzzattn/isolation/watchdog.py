"""Run a fuzzattn command in a child process and watch it: the child judges at full speed in its
own process, recording each call in flight (fuzzattn/platform/flight.py); when it dies by a
signal, reports a device fault, or overruns a call's deadline, the watchdog knows which case it
was judging.

The child runs in its own process group, so that a hang is ended with every process it started
(isolation workers, a fork server) and nothing outlives the run. SIGINT and SIGTERM reaching the
watchdog are passed on to the child, which stops, saves what it found and prints its table; the
child also dies with the watchdog if that is killed outright (PR_SET_PDEATHSIG on Linux).
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fuzzattn.platform import flight

SUPERVISED_ENV = "FUZZATTN_SUPERVISED"   # set in the child: it runs the command itself
FAULT_LOG_ENV = "FUZZATTN_FAULT_LOG"     # where the child's faulthandler writes its stacks
POLL = 0.05          # seconds between looks at the record
DUMP_WAIT = 0.5      # how long a hung child gets to write its stack before it is killed


@dataclasses.dataclass
class Ending:
    """How the child ended: its exit status, and for a crash the check it fails (hang, segfault,
    device_fault), what happened, and the flight record naming the case."""
    returncode: int
    check: str | None = None
    detail: str = ""
    record: flight.Flight | None = None
    seconds: float = 0.0


def _die_with_parent() -> None:
    """In the child, before exec: be killed if the watchdog dies (Linux; elsewhere a no-op)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def _where(log: Path) -> str:
    from fuzzattn.isolation.worker import where
    try:
        return where(log.read_text(errors="replace"))
    except OSError:
        return ""


def _kill_group(pid: int, sig=signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def run_watched(argv: list[str], *, env: dict | None = None, timeout: float | None = None,
                limit: float | None = None) -> Ending:
    """Run `argv` (a Python command that judges with fuzzattn) watched; its stdout and stderr are
    this process's. `timeout` fixes every call's deadline (else derived in the child); `limit`
    bounds the whole run (an Ending with check "limit" when it is reached)."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzzattn-watch-") as scratch:
        record_path, log = os.path.join(scratch, "flight"), Path(scratch, "stacks")
        flight.create(record_path)
        child_env = dict(os.environ if env is None else env)
        child_env.update({SUPERVISED_ENV: "1", flight.ENV: record_path, FAULT_LOG_ENV: str(log)})
        if timeout is not None:
            child_env[flight.TIMEOUT_ENV] = repr(float(timeout))
        child = subprocess.Popen(argv, env=child_env, start_new_session=True,
                                 preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        forwarded = []

        def forward(signum, _frame):
            forwarded.append(signum)
            _kill_group(child.pid, signum)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            ending = _watch(child, record_path, log, None if limit is None else start + limit)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            _kill_group(child.pid)          # whatever the child left running
        ending.seconds = time.monotonic() - start
        if forwarded and ending.check is None and ending.returncode < 0:
            # the child ended by the signal it was passed: report it the shell's way
            ending.returncode = 128 + forwarded[-1]
        return ending


def _watch(child: subprocess.Popen, record_path: str, log: Path, stop: float | None) -> Ending:
    while True:
        try:
            code = child.wait(timeout=POLL)
        except subprocess.TimeoutExpired:
            if stop is not None and time.monotonic() > stop:
                _kill_group(child.pid)
                return Ending(child.wait(), "limit", "the run's time limit was reached")
            record = flight.read(record_path)
            if record is not None and record.in_flight and time.monotonic() > record["deadline"]:
                return _hung(child, record, log)
            continue
        record = flight.read(record_path)
        if record is not None and record.faulted:
            return Ending(code, "device_fault", record.get("fault", ""), record)
        if code < 0 and record is not None and record.in_flight:
            return Ending(code, "segfault", f"the process died with {_signal_name(-code)}"
                                            f"{_where(log)}", record)
        if code < 0:
            return Ending(code, "died", f"the process died with {_signal_name(-code)} outside "
                                        f"any kernel call{_where(log)}", record)
        return Ending(code)


def _hung(child: subprocess.Popen, record: flight.Flight, log: Path) -> Ending:
    """Ask the child for its stack (faulthandler's SIGUSR1 handler runs even inside a C call),
    give it a moment, then end its whole process group."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(child.pid, signal.SIGUSR1)
    stop = time.monotonic() + DUMP_WAIT
    while time.monotonic() < stop and "File " not in _read(log):
        time.sleep(0.02)
    _kill_group(child.pid)
    code = child.wait()
    return Ending(code, "hang", f"no result from the {record.get('stage', 'forward')} call after "
                                f"{record['timeout']:g} s; process killed{_where(log)}", record)


def _read(log: Path) -> str:
    try:
        return log.read_text(errors="replace")
    except OSError:
        return ""


def install_fault_log() -> None:
    """In a watched child: write the Python stacks of a fatal signal, and of SIGUSR1 (the
    watchdog's request before it ends a hang), where the watchdog reads them."""
    path = os.environ.get(FAULT_LOG_ENV)
    if not path:
        return
    import faulthandler
    log = open(path, "w")       # kept open for the process's life: faulthandler writes to its fd
    faulthandler.enable(log, all_threads=False)
    if hasattr(faulthandler, "register"):
        faulthandler.register(signal.SIGUSR1, file=log, all_threads=False)
    install_fault_log.log = log
