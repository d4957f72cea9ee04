"""How this process's CPU thread waits for the GPU: spinning, yielding, or asleep.

CUDA's default (`auto`) spins whenever a process has fewer contexts than the host has logical
CPUs, which is always true of a fuzzing process: every read-back and synchronisation then keeps
a core busy polling while the GPU works for the other processes that share it. With 16 fuzzers
on a 16-core host the judges' own host work is what limits the rate, so a core spent polling is a core taken from another fuzzer. `yield` polls but gives the core to
any runnable thread; `block` sleeps until the device signals completion (a wake-up's latency per
wait instead of a core).

    FUZZATTN_CUDA_WAIT = auto | spin | yield | block     (default: DEFAULT)

Set on each device's primary context (the one torch uses) through the driver API, before torch
creates it: `apply()` is called by every entry point (the CLI, the pytest plugin, the isolation
worker) before anything runs on the GPU. It changes when the host
thread is woken, never what any kernel computes.
"""
from __future__ import annotations

import ctypes
import os

# CU_CTX_SCHED_* of the CUDA driver API (cuda.h): the low three bits of a context's flags.
MODES = {"auto": 0x0, "spin": 0x1, "yield": 0x2, "block": 0x4}
SCHED_MASK = 0x7
DEFAULT = "auto"
ENV = "FUZZATTN_CUDA_WAIT"


class CudaWaitError(ValueError):
    """FUZZATTN_CUDA_WAIT names no mode."""


class CudaWaitRefused(RuntimeError):
    """The driver kept a device's scheduling as it was (its primary context already active):
    the run goes on with CUDA's own, and says so."""


def requested() -> str:
    mode = os.environ.get(ENV, DEFAULT)
    if mode not in MODES:
        raise CudaWaitError(f"{ENV}={mode!r} is not one of {', '.join(MODES)}")
    return mode


def _driver():
    """libcuda with the driver initialised, or None (no driver: a CPU-only machine)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    return lib if lib.cuInit(0) == 0 else None


def _devices(lib) -> list[ctypes.c_int]:
    count = ctypes.c_int()
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    devices = []
    for ordinal in range(count.value):
        dev = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), ordinal) == 0:
            devices.append(dev)
    return devices


def _state(lib, dev) -> tuple[int, bool]:
    flags, active = ctypes.c_uint(), ctypes.c_int()
    lib.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))
    return flags.value, bool(active.value)


def apply(mode: str | None = None) -> str:
    """Set every visible device's primary context to wait by `mode` (default: the environment's,
    else DEFAULT); returns what was done, in words. `auto` leaves the driver untouched. Raises
    CudaWaitError for an unknown mode, and CudaWaitRefused (after trying every device) when the
    driver kept a device as it was."""
    mode = mode or requested()
    if mode not in MODES:
        raise CudaWaitError(f"{ENV}={mode!r} is not one of {', '.join(MODES)}")
    if mode == "auto":
        return "auto (CUDA's default)"
    lib = _driver()
    if lib is None:
        return f"{mode} requested; no CUDA driver here"
    setter = getattr(lib, "cuDevicePrimaryCtxSetFlags_v2", None) or lib.cuDevicePrimaryCtxSetFlags
    failed = []
    for dev in _devices(lib):
        flags, _ = _state(lib, dev)
        if setter(dev, (flags & ~SCHED_MASK) | MODES[mode]) != 0:
            failed.append(dev.value)
    if failed:
        raise CudaWaitRefused(f"{mode} requested; refused by the driver on device(s) {failed}")
    return mode


def current(ordinal: int = 0) -> str | None:
    """The wait mode device `ordinal`'s primary context has (or will be created with), or None
    without a driver or such a device."""
    lib = _driver()
    if lib is None:
        return None
    devices = _devices(lib)
    if ordinal >= len(devices):
        return None
    flags, _ = _state(lib, devices[ordinal])
    by_bits = {bits: name for name, bits in MODES.items()}
    return by_bits.get(flags & SCHED_MASK, f"flags {flags:#x}")
