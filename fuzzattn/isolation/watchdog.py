"""Run a fuzzattn command (or a pytest run) in a child process and watch it: the child judges at
full speed in its own process, each of its judging processes recording the call in flight
(fuzzattn/platform/flight.py); when one dies by a signal, reports a device fault, or overruns a
call's deadline, the watchdog knows which case it was judging.

The child runs in its own process group, so that a run that ends on a crash ends with every
process it started (isolation workers, a fork server, xdist workers) and nothing outlives it.
SIGINT and SIGTERM reaching the watchdog are passed on to the child, which stops, saves what it
found and prints its table; the child also dies with the watchdog if that is killed outright
(PR_SET_PDEATHSIG on Linux).

A CLI command stops at its first crash (`stop_at_first`). A pytest run goes on: pytest-xdist
replaces a worker that died or was ended for a hang and reports its test failed, and the
watchdog keeps every crash it saw.
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

POLL = 0.05          # seconds between looks at the records
DUMP_WAIT = 0.5      # how long a hung process gets to write its stack before it is killed


@dataclasses.dataclass
class Crash:
    """One judging process lost: the check it fails (hang, segfault, device_fault), what
    happened, and its flight record naming the case."""
    check: str
    detail: str
    record: flight.Flight


@dataclasses.dataclass
class Ending:
    """How the child ended: its exit status and the crashes seen (`limit`: the run's own time
    limit was reached; `died`: the child died outside any kernel call)."""
    returncode: int
    crashes: list[Crash] = dataclasses.field(default_factory=list)
    limit: bool = False
    died: str = ""
    seconds: float = 0.0

    @property
    def crash(self) -> Crash | None:
        return self.crashes[0] if self.crashes else None


def _die_with_parent() -> None:
    """In the child, before exec: be killed if the watchdog dies (Linux; elsewhere a no-op)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def stacks_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{pid}.stacks")


def _where(directory: str, pid: int) -> str:
    from fuzzattn.isolation.worker import where
    return where(_read(stacks_path(directory, pid)))


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:       # a zombie (exited, not yet reaped by its parent) is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


def _kill_group(pid: int, sig=signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


# What a child runs: `python -c` with this bootstrap, never `python -m`. Both put the working
# directory first on sys.path, where a folder named like an imported package (a clone of this
# repository, ./fuzzattn/) shadows the installed one; the bootstrap drops that entry before it
# imports anything (there is none under -P or PYTHONSAFEPATH). Kernels given as FILE.py:NAME
# are loaded by their path, so they need no entry on sys.path.
_BOOTSTRAP = """import sys
if {drop} and not getattr(sys.flags, "safe_path", False):
    del sys.path[0]
from {module} import {function}
sys.exit({function}())
"""


def python_command(module: str, function: str, argv: list[str], *,
                   keep_working_directory: bool = False) -> list[str]:
    """The command line of a Python child that runs `module.function()` (which reads
    sys.argv[1:]) with `argv`, the working directory off its sys.path unless kept."""
    code = _BOOTSTRAP.format(drop=not keep_working_directory, module=module, function=function)
    return [sys.executable, "-c", code, *argv]


def run_watched(argv: list[str], *, env: dict | None = None, timeout: float | None = None,
                limit: float | None = None, stop_at_first: bool = True, quiet: bool = False,
                cwd=None) -> Ending:
    """Run `argv` (a Python command that judges with fuzzattn) watched; its stdout and stderr are
    this process's (discarded with `quiet`). `timeout` fixes every call's deadline (else derived
    in the child); `limit` bounds the whole run."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzzattn-watch-") as directory:
        child_env = dict(os.environ if env is None else env)
        child_env.update({flight.WATCHER_ENV: str(os.getpid()), flight.ENV: directory})
        if timeout is not None:
            child_env[flight.TIMEOUT_ENV] = repr(float(timeout))
        output = subprocess.DEVNULL if quiet else None
        child = subprocess.Popen(argv, env=child_env, cwd=cwd, start_new_session=True, stdout=output,
                                 stderr=output,
                                 preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        forwarded = []

        def forward(signum, _frame):
            forwarded.append(signum)
            _kill_group(child.pid, signum)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            ending = _watch(child, directory, None if limit is None else start + limit,
                            stop_at_first, forwarded)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            _kill_group(child.pid)          # whatever the child left running
        ending.seconds = time.monotonic() - start
        if forwarded and not ending.crashes and ending.returncode < 0:
            ending.returncode = 128 + forwarded[-1]     # ended by the signal it was passed
            ending.died = ""
        return ending


def _watch(child: subprocess.Popen, directory: str, stop: float | None, stop_at_first: bool,
           forwarded: list) -> Ending:
    crashes: list[Crash] = []
    seen: set[tuple[int, int]] = set()          # (pid, seq) of records already judged a crash
    while True:
        try:
            code = child.wait(timeout=POLL)
        except subprocess.TimeoutExpired:
            code = None
        if code is None and stop is not None and time.monotonic() > stop:
            _kill_group(child.pid)
            return Ending(child.wait(), crashes, limit=True)
        for path in flight.records(directory):
            record = flight.read(path)
            if record is None or (record["pid"], record["seq"]) in seen:
                continue
            crash = _crash(record, directory, child.pid, code, stopping=bool(forwarded))
            if crash is not None:
                seen.add((record["pid"], record["seq"]))
                crashes.append(crash)
        if crashes and stop_at_first and code is None:
            _kill_group(child.pid)
            code = child.wait()
        if code is not None:
            died = ""
            if code < 0 and not crashes:
                died = (f"the process died with {_signal_name(-code)} outside any kernel call"
                        f"{_where(directory, child.pid)}")
            return Ending(code, crashes, died=died)


def _crash(record: flight.Flight, directory: str, child_pid: int, child_code: int | None, *,
           stopping: bool = False) -> Crash | None:
    """The crash a record shows, if any; a hung process is ended here. The child's own exit
    status is known (`child_code`); an xdist worker's belongs to its controller."""
    pid = record["pid"]
    if record.faulted:
        return Crash("device_fault", record.get("fault", ""), record)
    if not record.in_flight:
        return None
    if not _alive(pid):
        if stopping:
            return None                 # stopped on request (^C, SIGTERM), mid-call: no finding
        if pid == child_pid and child_code is None:
            return None                 # the child's own status comes with the next look
        how = ""
        if pid == child_pid and child_code is not None:
            how = (f" with {_signal_name(-child_code)}" if child_code < 0
                   else f" (exit status {child_code})")
        return Crash("segfault", f"the process died{how}{_where(directory, pid)}", record)
    if time.monotonic() > record["deadline"]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)      # faulthandler's handler runs even inside a C call
        give_up = time.monotonic() + DUMP_WAIT
        while time.monotonic() < give_up and "File " not in _read(stacks_path(directory, pid)):
            time.sleep(0.02)
        where = _where(directory, pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return Crash("hang", f"no result from the {record.get('stage', 'forward')} call after "
                             f"{record['timeout']:g} s; process killed{where}", record)
    return None


def install_fault_log() -> None:
    """In a watched process: write the Python stacks of a fatal signal, and of SIGUSR1 (the
    watchdog's request before it ends a hang), where the watchdog reads them."""
    directory = os.environ.get(flight.ENV)
    if (not directory or not flight.watched_here()
            or getattr(install_fault_log, "pid", None) == os.getpid()):
        return
    import faulthandler
    log = open(stacks_path(directory, os.getpid()), "w")   # kept open: faulthandler writes to its fd
    faulthandler.enable(log, all_threads=False)
    if hasattr(faulthandler, "register"):
        faulthandler.register(signal.SIGUSR1, file=log, all_threads=False)
    install_fault_log.log, install_fault_log.pid = log, os.getpid()
