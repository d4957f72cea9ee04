"""Judge cases in a supervised worker process, so a kernel that hangs, dies or faults the device
becomes a verdict instead of ending the run.

In-process judging cannot survive three ways kernels fail:

* a hang (a loop bound that never ends): nothing in the process can interrupt a kernel call, so
  `fuzz --seconds` is never consulted again;
* the process dying (a segfault in a driver or an extension, an abort): the run ends and the case
  is lost;
* a CUDA device fault (illegal memory access, device-side assert): the CUDA context stays poisoned
  for the rest of the process, so every later case fails for a reason that is not its own.

`IsolatedJudge` keeps one long-lived worker process (isolation/worker.py) per implementation
and sends it one case at a time. The supervisor knows the case before the worker runs it, so:

    no answer within `timeout` s  -> worker killed (SIGTERM, SIGKILL after a grace), verdict `hang`
    the worker process ends       -> verdict `segfault`, naming the signal or exit code
    a CUDA error in the answer    -> verdict `device_fault`, and the worker is replaced

Each verdict names the innermost frame of the implementation's own code where it stood (from the
worker's faulthandler dump). A case's timeout never includes a worker's start-up, which has its
own `start_timeout`; for an implementation declaring `compiles_per_shape` (torch.compile'd flex)
the first case of each shape a worker judges gets `flight.FIRST_CALL` instead, as a watched run's
first call does: that case compiles, and a compile is not a hang. These are ordinary failing
JudgedCases: Hypothesis shrinks them like any other, and the regression file they leave replays
isolated again.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import signal
import tempfile
import time
from pathlib import Path

from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.implementation import Implementation
from fuzzattn.platform import shared_gpu
from fuzzattn.platform.flight import FIRST_CALL, first_of_its_shape
from fuzzattn.inputs.materialize import inputs_sha256, materialize
from fuzzattn.platform.device_faults import is_device_fault
from fuzzattn.isolation import starting
from fuzzattn.isolation.worker import (FIELDS, IsolationError, declared, spec_of,
                                              where, worker_main)
from fuzzattn.judgement.judge import JudgedCase, default_device
from fuzzattn.judging.verdict import Verdict
from fuzzattn.platform.versions import versions

__all__ = ["DEFAULT_TIMEOUT", "IsolatedJudge", "IsolationError", "is_device_fault", "spec_of"]

DEFAULT_TIMEOUT = 60.0     # per case, when isolation is asked for without a timeout
START_TIMEOUT = 300.0      # importing torch, triton and a kernel module on a loaded machine, plus CUDA init
GRACE = 1.0                # SIGTERM -> SIGKILL, and how long a dying worker gets to be reaped


@dataclasses.dataclass
class IsolationStats:
    starts: int = 0                 # worker processes started (the first one included)
    start_seconds: float = 0.0      # total time waited for workers to become ready
    cases: int = 0                  # cases sent
    hangs: int = 0
    deaths: int = 0
    device_faults: int = 0


def _pickled(fields: dict | None) -> bytes | None:
    """The declared fields as bytes the worker unpickles once it has imported the implementation's
    own module (a config rule is pickled by reference to it); None when something in them is not
    importable by name (a lambda, a closure): the worker then uses the declaration it imports."""
    if fields is None:
        return None
    try:
        return pickle.dumps(fields)
    except (pickle.PicklingError, AttributeError, TypeError):
        return None


class IsolatedJudge:
    """Judge cases of one implementation in a supervised worker process (a context manager).

        with IsolatedJudge(get("sdpa"), timeout=10) as isolated:
            judged = isolated.judge(case)           # a JudgedCase

    `impl` is an Implementation (sent as its spec plus its declared fields, which the worker
    uses as they are) or a spec string (a registered name, `FILE.py:NAME`, `module:NAME`).
    `timeout` is seconds per case (None: wait forever, so only deaths and device faults are
    caught). The worker is started now and waited for up to `start_timeout`.
    """

    def __init__(self, impl: str | Implementation, *, timeout: float | None = DEFAULT_TIMEOUT,
                 device: str | None = None, start_timeout: float = START_TIMEOUT,
                 grace: float = GRACE):
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout={timeout!r} must be a positive number of seconds or None")
        if isinstance(impl, Implementation):
            self.spec, self.fields = spec_of(impl), declared(impl)
        else:
            self.spec, self.fields = impl, None
        self.timeout, self.start_timeout, self.grace = timeout, start_timeout, grace
        self.device = device or default_device()
        self.stats = IsolationStats()
        self._ctx = starting.context()
        self._proc = self._conn = self._log = None
        self._closed = False
        self._spawn()
        try:
            self._await_ready()
        except IsolationError as exc:
            import torch
            if (self._ctx.get_start_method() != "forkserver" or not torch.cuda.is_available()
                    or "cuda" not in str(exc).lower()):
                raise
            starting.fork_failed_on_cuda = True      # a CUDA context in a forked worker: spawn instead
            self._ctx = starting.context()
            self._spawn()
            self._await_ready()

    @property
    def name(self) -> str:
        return self.fields["name"]

    @property
    def cli_name(self) -> str:
        return self.fields.get("spec") or self.spec

    # -- lifecycle ------------------------------------------------------------------------------
    def _spawn(self) -> None:
        """Start a worker without waiting for it: its imports overlap whatever the caller does next."""
        import torch
        fd, self._log = tempfile.mkstemp(prefix="fuzzattn-worker-", suffix=".log")
        os.close(fd)
        parent, child = self._ctx.Pipe(duplex=True)
        self._proc = self._ctx.Process(
            target=worker_main, name=f"fuzzattn-isolated-{self.spec}", daemon=True,
            args=(child, self.spec, _pickled(self.fields), self.device, torch.get_num_threads(), self._log,
                  dict(os.environ)))
        with starting.main_module_hidden(), starting.server_without_cuda():
            self._proc.start()
        child.close()         # else the worker's death would never read as EOF here
        self._conn = parent
        self._ready = False
        self._compiled = set()    # a new process compiles every shape again
        self.stats.starts += 1

    def _await_ready(self) -> None:
        start = time.perf_counter()
        try:
            if not self._conn.poll(self.start_timeout):
                self._discard()
                raise IsolationError(f"worker for {self.spec} not ready after {self.start_timeout:g} s")
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            detail = self._death_detail()
            self._discard()
            raise IsolationError(f"worker for {self.spec} {detail} while starting") from None
        finally:
            self.stats.start_seconds += time.perf_counter() - start
        if kind == "error":
            self._discard()
            if shared_gpu.is_fault(payload) and shared_gpu.mps_active():
                # An MPS server refuses new clients until every client of a faulted GPU exited.
                raise shared_gpu.SharedDeviceFault(shared_gpu.describe(
                    f"starting a worker for {self.spec}", payload.splitlines()[0]))
            raise IsolationError(f"worker for {self.spec} could not start: {payload}")
        self.fields = self._merged(payload)
        self._ready = True

    def _merged(self, fields: dict) -> dict:
        """The worker's fields, completed by this process's declaration where one could not
        travel (worker.portable)."""
        if all(name in fields for name in FIELDS):
            return fields
        if self.fields is None:
            from fuzzattn.run.loader import load_implementation
            from fuzzattn.run.registry import get
            local = load_implementation(self.spec, probe=False) if ":" in self.spec else get(self.spec)
            self.fields = declared(local)
        return {**self.fields, **fields}

    def _ensure_ready(self) -> None:
        if self._closed:
            raise IsolationError("IsolatedJudge is closed")
        if self._proc is not None and not self._proc.is_alive():
            self._discard()                   # died while idle: nothing to blame on a case
        if self._proc is None:
            self._spawn()
        if not self._ready:
            self._await_ready()

    def _fault_dump(self) -> str:
        try:
            return Path(self._log).read_text(errors="replace") if self._log else ""
        except OSError:
            return ""

    def _death_detail(self) -> str:
        self._proc.join(self.grace)           # EOF came first; the exit status follows at once
        code = self._proc.exitcode
        if code is None:
            return "stopped answering (its pipe closed)"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"died with {name}"
        return f"exited with code {code}"

    def _discard(self) -> None:
        """Stop the worker for good (SIGTERM, then SIGKILL after the grace) and forget it."""
        proc, conn, log = self._proc, self._conn, self._log
        self._proc = self._conn = self._log = None
        self._ready = False
        if proc is not None and proc.is_alive():
            proc.terminate()
            proc.join(self.grace)
            if proc.is_alive():
                proc.kill()                   # SIGTERM is not enough inside a driver call
                proc.join()
        if proc is not None:
            proc.join(0)
            proc.close()
        if conn is not None:
            conn.close()
        if log:
            with contextlib.suppress(OSError, ValueError):
                os.unlink(log)

    def _replace(self) -> None:
        self._discard()
        if not self._closed:
            self._spawn()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._proc is not None and self._proc.is_alive():
            with contextlib.suppress(OSError, ValueError):
                self._conn.send(("stop", None))
            self._proc.join(self.grace)
        self._discard()

    def __enter__(self) -> "IsolatedJudge":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests -------------------------------------------------------------------------------
    def _case_timeout(self, case: AttentionCase, gradients: bool) -> float | None:
        """`timeout`, or FIRST_CALL for a per-shape compiler's first case of a shape (and of
        gradients judged or not) in the worker now running."""
        if (self.timeout is None or not getattr(self.fields.get("caps"), "compiles_per_shape", False)
                or not first_of_its_shape(self._compiled, case, gradients)):
            return self.timeout
        return max(self.timeout, FIRST_CALL)

    def _exchange(self, request: str, payload, timeout: float | None = None) -> tuple[str, object]:
        """Send one request; ('judged'|'faulted'|'declared'|'error', payload) from the worker, or
        ('hang', detail) / ('died', detail) decided here. After hang/died a new worker is starting.
        `timeout`: this request's, if not the judge's."""
        self._ensure_ready()
        timeout = self.timeout if timeout is None else timeout
        try:
            self._conn.send((request, payload))
            if self._conn.poll(timeout):
                return self._conn.recv()
        except (EOFError, OSError):
            detail = f"worker {self._death_detail()}{where(self._fault_dump())}"
            self.stats.deaths += 1
            self._replace()
            return "died", detail
        # No answer in time: ask for its stack (faulthandler's SIGUSR1 handler is C-level, so it
        # runs even while Python is blocked in a C call), give it a moment to write, then kill.
        with contextlib.suppress(OSError, ValueError):
            os.kill(self._proc.pid, signal.SIGUSR1)
        deadline = time.perf_counter() + min(self.grace, 0.5)
        while time.perf_counter() < deadline and "File " not in self._fault_dump():
            time.sleep(0.02)
        detail = f"no result after {timeout:g} s; worker killed{where(self._fault_dump())}"
        self.stats.hangs += 1
        self._replace()
        return "hang", detail

    def judge(self, case: AttentionCase, *, expected_sha256: str | None = None,
              gradients: bool = True, margins: bool = False) -> JudgedCase:
        """Judge `case` in the worker: its JudgedCase, or one with a hang/segfault/device_fault
        verdict (with the inputs' sha256 and the versions, so it makes a regression file).
        `margins`: as judge()'s, every bound on the whole rule."""
        self.stats.cases += 1
        self._ensure_ready()                  # (a worker started now has compiled nothing)
        kind, payload = self._exchange("judge", (case.to_dict(), expected_sha256, gradients, margins),
                                       self._case_timeout(case, gradients))
        if kind == "hang":
            return self._failed(case, "hang", payload)
        if kind == "died":
            return self._failed(case, "segfault", payload)
        if kind == "faulted":
            judged, headline = payload
            return self._classify(judged, left_faulted=headline)
        if kind == "error":
            headline, text = payload
            if shared_gpu.is_fault(text) and shared_gpu.mps_active():
                # A fault, or an MPS server's own error (another client's fault reaching this one),
                # as the worker's start and the probe call treat it: no verdict.
                self._replace()
                raise shared_gpu.SharedDeviceFault(shared_gpu.describe(case, headline))
            if is_device_fault(text):
                # A fault surfacing in the harness's own code after the kernel returned (an
                # asynchronous CUDA error) is still the kernel's fault.
                self.stats.device_faults += 1
                self._replace()
                return self._failed(case, "device_fault", f"after the call: {headline}")
            raise IsolationError(f"the harness raised in the worker judging {case}: {text}")
        return self._classify(payload)

    def _failed(self, case: AttentionCase, check: str, detail: str) -> JudgedCase:
        # The worker is gone with its inputs: materialise them here (on the CPU, where they are
        # generated before any move to the device) for the sha256 the regression file pins.
        return JudgedCase(self.name, case, [Verdict(impl=self.name, case=case, check=check,
                                                    passed=False, detail=detail)],
                          cli_name=self.cli_name, versions=versions(),
                          inputs_sha256=inputs_sha256(materialize(case, "cpu")))

    def _classify(self, judged: JudgedCase, left_faulted: str | None = None) -> JudgedCase:
        """Crashes that faulted the device, forward or backward, become device_fault, and the
        worker they poisoned is replaced: a CUDA error is sticky, so a worker kept after one fails
        every later case (docs/CALIBRATION.md#device-faults: after SDPA's backward faulted with a
        misaligned address, the next three files replayed in that worker failed the same way).

        A crash is the fault when its text says CUDA, or when the worker found its context faulted
        after the judgement (`left_faulted`, device_faults.context_fault: SDPA's fp16 and bf16
        backwards raised errors that do not say CUDA); with no crash to blame, the fault was
        asynchronous and a device_fault verdict is added."""
        note = f"; the CUDA context was left faulted: {left_faulted}" if left_faulted else ""
        verdicts, faulted = [], False
        for v in judged.verdicts:
            crashed = not v.passed and v.check in ("crash", "grad_crash")
            if crashed and (is_device_fault(v.detail) or (left_faulted and not faulted)):
                where = "" if v.check == "crash" else "in the backward: "
                v = dataclasses.replace(v, check="device_fault", detail=f"{where}{v.detail}{note}")
                faulted = True
            verdicts.append(v)
        if left_faulted and not faulted:
            verdicts.append(Verdict(impl=self.name, case=judged.case, check="device_fault",
                                    passed=False, detail=f"after the call{note}"))
        elif not faulted:
            shared_gpu.check_judged(judged)     # an MPS client told of another's fault
            return judged
        self.stats.device_faults += 1
        self._replace()
        if shared_gpu.mps_active():
            # Under MPS the fault may be another process's (fuzzattn/platform/shared_gpu.py): no verdict.
            fault = next(v for v in verdicts if v.check == "device_fault")
            raise shared_gpu.SharedDeviceFault(shared_gpu.describe(judged.case, fault.detail))
        # A judgement that passed in the worker carries no sha256 or versions; a failure needs them.
        return dataclasses.replace(
            judged, verdicts=verdicts, versions=judged.versions or versions(),
            inputs_sha256=judged.inputs_sha256 or inputs_sha256(materialize(judged.case, "cpu")))

    def probe(self) -> dict | None:
        """Run the loader's probe call in the worker; the declared fields it yields, or None when
        the probe hung, killed the worker or faulted the device (a finding the campaign will make
        and shrink on its own). A probe that raises is an IsolationError, as it is a load error."""
        kind, payload = self._exchange("probe", None)
        if kind == "declared":
            self.fields = self._merged(payload)
            return self.fields
        if kind == "error":
            headline, text = payload
            if shared_gpu.is_fault(text) and shared_gpu.mps_active():
                self._replace()
                raise shared_gpu.SharedDeviceFault(shared_gpu.describe(
                    f"in the loader's probe call of {self.spec}", headline))
            if is_device_fault(text):
                self._replace()
                return None
            raise IsolationError(headline)
        return None
