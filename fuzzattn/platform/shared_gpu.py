"""Device faults on a GPU shared through MPS: an error that ends the run, never a verdict.

Without MPS every fuzzing process has a CUDA context of its own, and a device fault (an illegal
address, a misaligned access, a device-side assert) ends the context of the process whose kernel
caused it: that process's crash or device_fault verdict names the right implementation, and the
others judge on. Under MPS (`nvidia-cuda-mps-control -d`, which lets several
fuzzers' kernels overlap on one GPU) the processes are
clients of one server, and a fatal fault of one client reaches every client running on the GPU
at the time (NVIDIA's MPS documentation, error containment on Volta and later). A process that
sees a fault there cannot tell its own kernel's from another client's. A crash verdict would
blame an implementation that may be innocent, and its regression file would replay clean.

So while MPS is active, a judgement that meets a device fault raises SharedDeviceFault, naming the
case in flight and the fault, and writes no verdict and no file. It is a BaseException, as
KeyboardInterrupt is: Hypothesis propagates it at once instead of shrinking it, and the CLI
reports it as an error (exit status 3). Judge again without MPS, or that case alone with
`--isolate` and without MPS, to find which kernel faulted. A fault costs the run, never the truth
of a verdict.

    FUZZATTN_MPS = auto | on | off      (default auto)

auto: MPS is active when CUDA is available and the MPS pipe directory (CUDA_MPS_PIPE_DIRECTORY,
default /tmp/nvidia-mps, where a CUDA client looks for the server) holds the server's `control`
pipe. on: always (an MPS server fuzzattn cannot see, and the tests of this module on the CPU).
off: never (a host whose stale pipe directory says MPS where there is none).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from fuzzattn.platform.device_faults import is_device_fault

ENV = "FUZZATTN_MPS"
MODES = ("auto", "on", "off")
DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"

# The checks under which a judgement reports a kernel's device fault (the isolation supervisor
# turns crashes that faulted the device into device_fault).
FAULT_CHECKS = ("crash", "grad_crash", "device_fault")
# Under MPS a client whose server faulted (another client's kernel) is told so by errors of the
# server itself: cudaErrorMpsClientTerminated ("the MPS client has been terminated by the
# server"), cudaErrorMpsServerNotReady while it recovers, and the like.
_MPS_ERROR = re.compile(r"\bMPS\b", re.IGNORECASE)


# judge() applies the rule in the process that judges, except in an isolated worker, whose
# supervisor applies it to what the worker reports (fuzzattn/isolation/supervisor.py): a BaseException raised
# inside the worker would end it as if it had died.
guarding = True


class SharedDeviceFault(BaseException):
    """A device fault met while the GPU is shared through MPS: it may be another process's."""


def mode() -> str:
    value = os.environ.get(ENV, "auto")
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r} is not one of {', '.join(MODES)}")
    return value


def mps_active() -> bool:
    """Whether this process's CUDA work goes through an MPS server (FUZZATTN_MPS, module doc)."""
    setting = mode()
    if setting != "auto":
        return setting == "on"
    pipes = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIRECTORY)
    if not (pipes / "control").exists():
        return False
    import torch
    return torch.cuda.is_available()


def describe(doing, fault: str) -> str:
    """The error's one line: `doing` is what met the fault (a case: "judging" it)."""
    doing = doing if isinstance(doing, str) else f"judging {doing}"
    return (f"a device fault while the GPU is shared through MPS ({fault}), {doing}: under MPS "
            f"one process's fault reaches every process on the GPU, so it cannot be pinned on "
            f"the implementation judged here and no verdict was recorded; judge again without "
            f"MPS (or set {ENV}=off where no MPS server runs)")


def is_fault(text: str) -> bool:
    """A device fault's text, or an MPS server's error (another client's fault reaching this one,
    or the server refusing clients while it recovers from one)."""
    return is_device_fault(text) or bool(_MPS_ERROR.search(text or ""))


def check_judged(judged) -> None:
    """Raise SharedDeviceFault when MPS is active and `judged` failed by a device fault."""
    faults = [v for v in judged.verdicts
              if not v.passed and v.check in FAULT_CHECKS and is_fault(v.detail)]
    if faults and mps_active():
        raise SharedDeviceFault(describe(judged.case, f"{faults[0].check}: {faults[0].detail}"))


def check_error(exc: BaseException, case) -> None:
    """Raise SharedDeviceFault (from `exc`) when MPS is active and `exc`, raised by the harness
    while judging `case`, is a device fault surfacing in its own code."""
    text = f"{type(exc).__name__}: {exc}"
    if is_fault(text) and mps_active():
        raise SharedDeviceFault(describe(case, text.splitlines()[0])) from exc
