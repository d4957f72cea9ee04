"""How this process waits for the GPU: spinning (CUDA's default while a process has few threads)
or blocking on a synchronisation primitive.

A fuzzing process synchronises with the GPU dozens of times per case (reading a verdict's inputs
back, catching an asynchronous fault right after the call). With one process per core sharing one
GPU, CUDA's default is to spin: every waiting process burns its core while the GPU serves another
process's time slice, and the host judging the others do (engine/judge_device.py) runs on what is
left. `block_while_waiting()` asks the runtime to block instead (cudaDeviceScheduleBlockingSync),
which must happen before this process creates its CUDA context. Opt in with
FUZZATTN_CUDA_BLOCKING_SYNC=1 (benchmarks/gpu_campaign.py reads it); the result is reported, never
raised: a runtime that refuses leaves the default in place.
"""
from __future__ import annotations

import ctypes
import os

ENV = "FUZZATTN_CUDA_BLOCKING_SYNC"
SCHEDULE_BLOCKING_SYNC = 0x04        # cudaDeviceScheduleBlockingSync (driver_types.h)
# Library names torch's CUDA builds load (already in the process after `import torch`, so dlopen
# hands back that copy, whose primary context torch will use).
CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")


def requested() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def block_while_waiting() -> str:
    """Set cudaDeviceScheduleBlockingSync for this process's device; one line saying what
    happened. Call it before anything touches CUDA in this process."""
    import torch
    if not torch.cuda.is_available():
        return "blocking sync: no CUDA"
    for name in CUDART_NAMES:
        try:
            cudart = ctypes.CDLL(name)
        except OSError:
            continue
        status = cudart.cudaSetDeviceFlags(ctypes.c_uint(SCHEDULE_BLOCKING_SYNC))
        return (f"blocking sync: set ({name})" if status == 0
                else f"blocking sync: {name} refused it with cudaError {status}")
    return "blocking sync: no CUDA runtime library found"
