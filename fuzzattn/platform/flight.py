"""The flight record: which case a supervised process is judging right now, and by when that call
should have returned, written where its supervisor can read it after the process hung or died.

Each judging process maps a small file of its own in the directory its supervisor names in
FUZZATTN_FLIGHT (`<pid>.flight`; a pytest run's xdist workers each write theirs) and, around
every call of an implementation (`execute.call`, `execute.call_gradients`), writes the case and a
deadline into it: no message, no round trip, a few microseconds a call. The supervisor
(fuzzattn/isolation/watchdog.py) polls the file; when the process dies by a signal, or a deadline passes,
the record names the case that was in flight.

A call's deadline is `timeout_for`: the --timeout given, else derived from the implementation's
measured speed in this process (the median seconds per multiply-add of its recent calls) times
the case's size, with a floor that covers a compile, and a generous first call. An
implementation that declares `compiles_per_shape` compiles again for every new shape, so its
first call on each shape gets the first call's deadline: a torch.compile of flex's forward and
backward took over 60 s with 16 pytest workers compiling beside it (docs/CALIBRATION.md#compiles).
"""
from __future__ import annotations

import dataclasses
import json
import mmap
import os
import statistics
import struct
import time
from collections import defaultdict, deque

ENV = "FUZZATTN_FLIGHT"                 # directory of the records; unset: nothing is recorded
WATCHER_ENV = "FUZZATTN_SUPERVISED"     # the watchdog's pid
TIMEOUT_ENV = "FUZZATTN_CASE_TIMEOUT"   # seconds per call, set from --timeout
SIZE = 1 << 16
MAGIC = b"FZFLIGHT"
# magic, sequence number, pid, deadline (time.monotonic(); 0: no call in flight), the call's
# timeout in seconds, payload bytes
HEADER = struct.Struct("<8sQQddI")
_DEADLINE_AT = struct.calcsize("<8sQQ")

FLOOR = 60.0            # seconds: no call is declared hung sooner (a Triton compile fits in it)
FIRST_CALL = 300.0      # an implementation's first call: imports, CUDA start-up, first compiles
SLOWDOWN = 50.0         # a call may take this many times its expected time before it is a hang
MIN_WORK = 1 << 16      # multiply-adds below which a call's time is overhead, not work
FAULTED = -1.0          # the deadline field of a call that faulted the device
DEVICE_FAULT_EXIT = 86  # the exit status of a process that ended on a device fault


def work(case) -> int:
    """Multiply-adds of one attention matmul of the case: what a call's time grows with."""
    return max(case.batch * case.heads * case.seq_q * case.seq_k * case.head_dim, MIN_WORK)


class Speeds:
    """Seconds per multiply-add of each implementation's recent calls, for its next deadline."""

    def __init__(self, recent: int = 64):
        self._rates = defaultdict(lambda: deque(maxlen=recent))
        self._compiled = defaultdict(set)      # per-shape compilers: the shapes called so far

    def note(self, name: str, case, seconds: float) -> None:
        self._rates[name].append(seconds / work(case))

    def timeout(self, name: str, case, *, compiles_per_shape: bool = False, stage: str = "") -> float:
        rates = self._rates.get(name)
        if not rates:
            return FIRST_CALL
        if compiles_per_shape and first_of_its_shape(self._compiled[name], case, stage):
            return FIRST_CALL
        return max(FLOOR, SLOWDOWN * statistics.median(rates) * work(case))


# What a case's tensors hold, not their shape: a per-shape compiler does not compile again for it.
_VALUE_FIELDS = frozenset({"values", "data_seed", "generator"})


def compiled_shape(case) -> tuple:
    """What a per-shape compiler specialises on: every field of the case but its values."""
    return tuple(getattr(case, f.name) for f in dataclasses.fields(case)
                 if f.name not in _VALUE_FIELDS)


def first_of_its_shape(seen: set, case, stage) -> bool:
    """Whether a per-shape compiler meets this (stage, shape) for the first time in the process
    whose calls `seen` records (then noted there): that call compiles, and gets FIRST_CALL."""
    shape = (stage, *compiled_shape(case))
    if shape in seen:
        return False
    seen.add(shape)
    return True


class Recorder:
    """The judging process's side: `begin` before a call, `end` after it."""

    def __init__(self, path: str, timeout: float | None = None):
        create(path)
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._seq = 0
        self._pid = os.getpid()
        self._fixed = timeout
        self.speeds = Speeds()
        self.context: dict = {}          # what the campaign in progress is: set by campaigns
        self._payload_for = (None, None, None, b"")      # (case, impl name, stage, payload)
        self._started = 0.0

    def begin(self, impl, case, stage: str) -> None:
        cached_case, cached_impl, cached_stage, payload = self._payload_for
        if cached_case is not case or cached_impl != impl.name or cached_stage != stage:
            payload = json.dumps({"impl": impl.name, "spec": impl.cli_name, "stage": stage,
                                  "case": case.to_dict(), "context": self.context}).encode()
            payload = payload[:SIZE - HEADER.size]
            self._payload_for = (case, impl.name, stage, payload)
        timeout = self._fixed or self.speeds.timeout(
            impl.name, case, compiles_per_shape=impl.caps.compiles_per_shape, stage=stage)
        self._map[HEADER.size:HEADER.size + len(payload)] = payload
        self._seq += 1
        self._started = time.monotonic()
        HEADER.pack_into(self._map, 0, MAGIC, self._seq, self._pid, self._started + timeout,
                         timeout, len(payload))

    def end(self, impl, case) -> None:
        struct.pack_into("<d", self._map, _DEADLINE_AT, 0.0)
        self.speeds.note(impl.name, case, time.monotonic() - self._started)

    def abandon(self) -> None:
        """The call in flight, if any, is no longer this process's to finish (it is being
        stopped): its ending is not a finding."""
        struct.pack_into("<d", self._map, _DEADLINE_AT, 0.0)

    def device_fault(self, impl, case, stage: str, summary: str) -> None:
        """Record that this call faulted the GPU, and end the process: its CUDA context is lost,
        and the supervisor saves the case and carries on in a fresh one."""
        payload = json.dumps({"impl": impl.name, "spec": impl.cli_name, "stage": stage,
                              "case": case.to_dict(), "context": self.context,
                              "fault": summary}).encode()[:SIZE - HEADER.size]
        self._map[HEADER.size:HEADER.size + len(payload)] = payload
        self._seq += 1
        HEADER.pack_into(self._map, 0, MAGIC, self._seq, self._pid, FAULTED, 0.0, len(payload))
        self._map.flush()
        import sys
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(DEVICE_FAULT_EXIT)


_recorder: Recorder | None = None
_checked_pid: int | None = None
_adopted: int | None = None      # this process's pid once a watched parent vouched for it


def parent_of(pid: int) -> int | None:
    """The parent process of `pid` (Linux /proc), or None."""
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def adopt() -> None:
    """Watch this process too: a worker of a watched process's own process pool (`fuzzattn fuzz
    --workers`), started by spawn or a fork server, so that neither its parent nor its
    grandparent need be the watched process. Called in the worker, when its parent was watched."""
    global _adopted, _checked_pid
    _adopted, _checked_pid = os.getpid(), None


def watched_here() -> bool:
    """Whether this process is one its watchdog watches: the watchdog's child itself, an xdist
    worker of that child, or a pool worker it adopted. Anything they start (a test's own
    subprocess, an isolation worker) inherits the environment but is not watched: its crashes
    are not the run's."""
    if _adopted == os.getpid():
        return True
    try:
        watcher = int(os.environ.get(WATCHER_ENV, ""))
    except ValueError:
        return False
    parent = os.getppid()
    if parent == watcher:
        return True
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and parent_of(parent) == watcher


def recorder() -> Recorder | None:
    """This process's recorder, or None when no supervisor asked for one (made once per process:
    a forked or spawned isolation worker never writes its parent's record)."""
    global _recorder, _checked_pid
    if _checked_pid != os.getpid():
        _checked_pid = os.getpid()
        directory = os.environ.get(ENV) if watched_here() else None
        timeout = os.environ.get(TIMEOUT_ENV)
        _recorder = (Recorder(record_path(directory, os.getpid()), float(timeout) if timeout else None)
                     if directory else None)
    return _recorder


def abandon_on_sigterm() -> None:
    """In a worker of a watched process's pool: SIGTERM marks the call in flight abandoned, then
    ends the process. A ProcessPoolExecutor whose worker died terminates all the others; their
    calls are not crashes, and the watchdog would otherwise save each as a segfault."""
    import signal

    def stopped(signum, _frame):
        rec = recorder()
        if rec is not None:
            rec.abandon()
        os._exit(128 + signum)
    signal.signal(signal.SIGTERM, stopped)


def set_context(**context) -> None:
    """Name the campaign in progress in every later record (how the supervisor shrinks a case)."""
    rec = recorder()
    if rec is not None:
        rec.context = context


def disable() -> None:
    """Stop recording in this process (an isolation worker, whose own supervisor watches it)."""
    global _recorder, _checked_pid
    os.environ.pop(ENV, None)
    _recorder, _checked_pid = None, os.getpid()


# -- the supervisor's side -----------------------------------------------------------------------
def record_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{pid}.flight")


def records(directory: str) -> list[str]:
    """The record files of a directory, one per process that judged under its supervisor."""
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if name.endswith(".flight"))


def create(path: str) -> None:
    with open(path, "wb") as f:
        f.write(b"\0" * SIZE)


class Flight(dict):
    """One record as read: impl, spec, stage, case (a dict), context, plus seq, pid, deadline
    and timeout (and fault, for a call that faulted the device)."""

    @property
    def in_flight(self) -> bool:
        return self["deadline"] > 0

    @property
    def faulted(self) -> bool:
        return self["deadline"] == FAULTED


def read(path: str) -> Flight | None:
    """The last record written, or None before the first (read until two reads agree: the
    writer may be mid-record)."""
    with open(path, "rb") as f:
        data = f.read(SIZE)
    for _ in range(10):
        with open(path, "rb") as f:
            again = f.read(SIZE)
        if again == data:
            break
        data = again
    if len(data) < SIZE:
        return None                      # still being created
    magic, seq, pid, deadline, timeout, n = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        return None
    try:
        record = Flight(json.loads(data[HEADER.size:HEADER.size + n]))
    except ValueError:
        return None
    record.update(seq=seq, pid=pid, deadline=deadline, timeout=timeout)
    return record
