"""The one way fuzzattn runs an implementation, and the one summary of what it raised.

Judging, the refusal property, metamorphic relations and the load probe all call an
implementation through `call`, so an exception means the same thing everywhere:

    refused    UnsupportedCaseError, or an error the implementation declares as its way of
               refusing (`Capabilities.refusals`, e.g. a backend's "No available kernel")
    contract   it answered, but in a shape or dtype the contract does not allow
    crash      anything else it raised

`one_line` is the single exception summary every report uses: the type and the first line of
the message (a compiler's MLIR dump or a long traceback text never reaches the terminal).

Compile errors (Triton's CompilationError, an MLIR pass failure) are crashes whose summary is the
compiler's first error line and the configuration; the whole compiler output — the exception
text and whatever the compiler printed to the process's stderr (MLIR dumps are written there by
C++, below Python; Triton prints a failed ptxas run's whole PTX to stdout) — goes to a log file
whose path the summary names. For that, stdout and stderr are captured at the file-descriptor
level around every call and replayed unchanged when the call did not fail to compile.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path

import torch

from fuzzattn.contract.capabilities import UnsupportedCaseError
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.implementation import ContractError, Implementation
from fuzzattn.platform import flight
from fuzzattn.platform.device_faults import is_device_fault
from fuzzattn.run.pruning import autotuner_skips

OK, REFUSED, CONTRACT, CRASH = "ok", "refused", "contract", "crash"


def one_line(exc: BaseException) -> str:
    """'TypeName: first line of the message' (the type alone when the message is empty)."""
    text = str(exc).strip().splitlines()
    first = text[0].strip() if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


@dataclasses.dataclass
class Call:
    """What one call of an implementation gave: its outputs, or how it failed."""
    status: str                              # ok | refused | contract | crash
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    error: BaseException | None = None
    summary: str = ""                        # one_line(error), or "" when it answered
    declared_refusal: bool = False           # refused with an error its Capabilities name
    grads: tuple | None = None               # (dq, dk, dv) of a call_gradients that answered
    # 'TypeName: message' of a compile error Triton's autotuner skips (fuzzattn/run/pruning.py)
    autotuner_skips: str = ""
    origin: str = ""                         # a crash's innermost frame in the kernel's code

    @property
    def answered(self) -> bool:
        return self.status == OK


def is_declared_refusal(impl: Implementation, exc: BaseException) -> bool:
    """An error the implementation declares as its way of refusing (Capabilities.refusals)."""
    message = str(exc)
    return any(marker in message for marker in impl.caps.refusals)


LOG_DIR = Path(tempfile.gettempdir()) / "fuzzattn-logs"
# Exception types and texts that mean the kernel did not compile (not that it ran and failed).
# PTXASError: ptxas (the CUDA assembler Triton calls) failed, as in a ptxas crash
# (error code -11) on one triton_fa2 configuration, after Triton printed the whole PTX.
_COMPILE_TYPES = ("CompilationError", "CompileTimeAssertionFailure", "MLIRError", "PTXASError")
_COMPILE_TEXT = re.compile(r"PassManager::run failed|error: .*(mlir|ttg|ttir|llvm)|"
                           r"out of resource: shared memory", re.IGNORECASE)


def is_compile_error(exc: BaseException) -> bool:
    return (any(name in type(exc).__name__ for name in _COMPILE_TYPES)
            or bool(_COMPILE_TEXT.search(str(exc))))


def _first_error_line(text: str) -> str:
    """The compiler's first line that reads as an error, else the first non-empty line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if re.search(r"\berror\b|assert|out of resource", line, re.IGNORECASE):
            return line[:200]
    return lines[0][:200] if lines else ""


_sink = None           # (pid, file): the one temporary file this process captures calls into


def _output_sink():
    """A temporary file for captured output, emptied, made once per process (a forked child
    makes its own: a shared file description would share the offset) and per nesting level."""
    global _sink
    if _sink is not None and _sink[0] == os.getpid() and not _sink[1].closed:
        sink = _sink[1]
        if getattr(sink, "_fuzzattn_in_use", False):
            return tempfile.TemporaryFile(mode="w+b"), True       # nested call: its own file
        # Emptied only when a call wrote to it: ftruncate touches the file system, ~9 us of
        # every call on the CPU, where almost no call prints anything.
        if os.fstat(sink.fileno()).st_size:
            sink.seek(0)
            sink.truncate()
    else:
        sink = tempfile.TemporaryFile(mode="w+b")
        _sink = (os.getpid(), sink)
    return sink, False


def _written(sink) -> str:
    """What descriptors 1 and 2 wrote into `sink` (emptied before the call); nothing to read
    when it is still empty, as after almost every call (a size asked of the file system, which
    leaves the file's offset and the buffered reader's state alone)."""
    if not os.fstat(sink.fileno()).st_size:
        return ""
    sink.flush()
    sink.seek(0)
    return sink.read().decode(errors="replace")


@contextlib.contextmanager
def _captured_output():
    """Route file descriptors 1 and 2 into a temporary file, and Python's sys.stdout/sys.stderr
    into a buffer (they need not write to those descriptors: pytest swaps them), for the
    duration; yields a function that returns everything written."""
    python_side = io.StringIO()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = (os.dup(1), os.dup(2))
    except (OSError, ValueError):        # no real stdout/stderr (embedded interpreters)
        with contextlib.redirect_stdout(python_side), contextlib.redirect_stderr(python_side):
            yield python_side.getvalue
        return
    sink, own = _output_sink()
    sink._fuzzattn_in_use = True
    try:
        with contextlib.redirect_stdout(python_side), contextlib.redirect_stderr(python_side):
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                yield lambda: python_side.getvalue() + _written(sink)
            finally:
                for fd, copy in zip((1, 2), saved):
                    os.dup2(copy, fd)
                    os.close(copy)
    finally:
        sink._fuzzattn_in_use = False
        if own:
            sink.close()


def _compile_log(impl: Implementation, case: AttentionCase, exc: BaseException, output: str) -> Path:
    """Write the whole compiler output for this (implementation, case) and return its path."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    tag = hashlib.sha256(f"{impl.cli_name}|{case.key()}".encode()).hexdigest()[:12]
    path = LOG_DIR / f"compile-{impl.name}-{tag}.log"
    path.write_text(f"implementation: {impl.cli_name}\ncase: {case}\nconfig: {case.config_dict}\n"
                    f"\n--- exception ---\n{type(exc).__name__}: {exc}\n"
                    f"\n--- stdout and stderr during the call ---\n{output}")
    return path


def _detached(exc: BaseException) -> BaseException:
    """`exc` with no traceback on it or on the exceptions it chains. A traceback holds every frame
    from this module down to the kernel's raise, and with them their locals (the inputs, the
    kernel's temporaries: on a GPU, device memory) in a reference cycle with the Call keeping
    the exception (this frame -> its Call -> the exception -> its traceback -> this frame), which
    only the collector frees, and late: a crash verdict needs the message alone."""
    pending, seen = [exc], set()
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        pending += [e.__cause__, e.__context__]
    return exc


def call(impl: Implementation, q, k, v, case: AttentionCase, *, out=None, lse=None,
         synchronize: bool = True) -> Call:
    """Call `impl` the contract's way on (q, k, v); never raises for what the kernel does.

    On CUDA the call is synchronised before returning, so an asynchronous kernel fault surfaces
    here, as this call's crash, not in whatever touches the device next. Under a supervisor the
    call is recorded in flight (fuzzattn/platform/flight.py) while it runs."""
    record = flight.recorder()
    with _captured_output() as output_text:
        if record is not None:
            record.begin(impl, case, "forward")
        try:
            got_out, got_lse = impl(q, k, v, case, out=out, lse=lse)
            if synchronize and q.device.type == "cuda":
                torch.cuda.synchronize(q.device)
        except BaseException as exc:
            if record is not None and not isinstance(exc, Exception):
                record.end(impl, case)      # ^C or SIGTERM inside the call: the run stops, cleanly
            if not isinstance(exc, Exception):
                raise
            result = _failed_call(impl, exc)
        else:
            result = Call(OK, out=got_out, lse=got_lse)
        if record is not None:
            record.end(impl, case)
        printed = output_text()
    if result.status == CRASH:
        end_on_device_fault(impl, case, "forward", result.summary, q.device)
    return _summarised(impl, case, result, printed)


def _failed_call(impl: Implementation, exc: Exception) -> Call:
    """What a call that raised is: a contract violation, a refusal, or a crash."""
    if isinstance(exc, ContractError):
        return Call(CONTRACT, error=_detached(exc), summary=one_line(exc))
    declared = is_declared_refusal(impl, exc)
    status = REFUSED if declared or isinstance(exc, UnsupportedCaseError) else CRASH
    skips = autotuner_skips(exc) if status == CRASH else ""     # before the traceback goes
    origin = crash_origin(impl, exc) if status == CRASH else ""
    return Call(status, error=_detached(exc), summary=one_line(exc), declared_refusal=declared,
                autotuner_skips=skips, origin=origin)


def _own_files(impl: Implementation) -> set[str]:
    """The files of the implementation's own code: its callables' and its declared sources."""
    files = {os.path.basename(path) for path in impl.sources}
    for fn in (impl.fn, impl.backward_fn):
        code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__call__", None),
                                                        "__code__", None)
        if code is not None:
            files.add(os.path.basename(code.co_filename))
    return files


def crash_origin(impl: Implementation, exc: BaseException) -> str:
    """'FILE.py:function' of the innermost frame of the traceback inside the implementation's
    own files, or '' (none there: it raised from a library it calls, or a compiler). Crash
    triagers tell crashes apart by where in the code under test they strike; the function, not
    the line, so that an edit elsewhere in the file keeps a crash's identity."""
    own = _own_files(impl)
    origin = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        name = os.path.basename(frame.filename)
        if name in own:
            origin = f"{name}:{frame.name}"
    return origin


def _summarised(impl, case, result: Call, printed: str) -> Call:
    """A compile error as one line with its log's path; anything else the call printed, on
    stderr."""
    if result.status == CRASH and is_compile_error(result.error):
        log = _compile_log(impl, case, result.error, printed)
        config = f" config={case.config_dict}" if case.config else ""
        first = _first_error_line(str(result.error)) or _first_error_line(printed)
        result.summary = (f"compile error: {type(result.error).__name__}: {first}{config} "
                          f"(compiler output: {log})")
    elif printed:
        sys.stderr.write(printed)      # not a compile failure: what the call printed, on stderr
    return result


def call_gradients(impl: Implementation, q, k, v, dout, case: AttentionCase, *, out=None,
                   lse=None, synchronize: bool = True) -> Call:
    """`Implementation.gradients` (explicit backward or autograd), summarised like `call`:
    whatever it raises is this call's crash, refusal or contract violation, never the harness's."""
    record = flight.recorder()
    if record is not None:
        record.begin(impl, case, "backward")
    try:
        grads = impl.gradients(q, k, v, dout, case, out=out, lse=lse)
        if synchronize and q.device.type == "cuda":
            torch.cuda.synchronize(q.device)
    except BaseException as exc:   # a backward that raises is a verdict, not a harness error
        if record is not None and not isinstance(exc, Exception):
            record.end(impl, case)
        if not isinstance(exc, Exception):
            raise
        result = _failed_call(impl, exc)
    else:
        result = Call(OK, grads=tuple(grads))
    if record is not None:
        record.end(impl, case)
    if result.status == CRASH:
        end_on_device_fault(impl, case, "backward", result.summary, q.device)
    return result


def end_on_device_fault(impl, case, stage: str, summary: str, device) -> None:
    """A watched process whose kernel faulted the GPU ends here, the case recorded: its CUDA
    context is lost for every later case. Called where the fault surfaces: in the call when it
    synchronises, else in the read-back of its outputs; a fault left to surface in the next
    case's first launch would end the run with the case lost (under MPS the fault may be another
    process's, and fuzzattn/platform/shared_gpu.py ends the run instead)."""
    record = flight.recorder()
    if record is None or torch.device(device).type != "cuda" or not is_device_fault(summary):
        return
    from fuzzattn.platform import shared_gpu
    if not shared_gpu.mps_active():
        record.device_fault(impl, case, stage, summary)
