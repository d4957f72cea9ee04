"""How isolated workers start: forked from a fork server, or spawned where forking failed."""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import types

# torch.cuda.is_available() and device_count() ask NVML instead of the CUDA driver when this is
# "1": the fork server on a GPU host must never initialise CUDA, or no worker forked from it could.
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
fork_failed_on_cuda = False     # a forked worker could not start on this GPU host: spawn from now on


def context():
    """How workers start: forked from a fork server that has imported torch and fuzzattn and
    judged a case on the CPU already (isolation/preload.py), so a restart after a hang or death
    costs milliseconds, not the seconds of a spawned worker's imports (on a GPU host under load,
    5-10 s a restart: an isolated shrink of a segfault used up its 120 s). The server never
    touches CUDA (NVML_CHECK, and preload.py); each forked worker creates its own CUDA context.
    Should a forked worker fail to start on a GPU host, workers are spawned from then on."""
    import torch
    if fork_failed_on_cuda and torch.cuda.is_available():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["fuzzattn.isolation.preload"])
    return ctx


@contextlib.contextmanager
def server_without_cuda():
    """NVML_CHECK set while a worker starts, so a fork server started now inherits it."""
    before = os.environ.get(NVML_CHECK)
    os.environ[NVML_CHECK] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NVML_CHECK, None)
        else:
            os.environ[NVML_CHECK] = before


@contextlib.contextmanager
def main_module_hidden():
    """`spawn` re-runs the parent's __main__ in the child so that objects pickled from it resolve.
    The worker needs nothing from it (its target and arguments live in fuzzattn or are plain
    data), and re-running it costs imports (pytest's, a benchmark's), fails for a stdin or REPL
    main, and re-executes a script that lacks an `if __name__ == "__main__"` guard. So the child is
    shown a bare __main__ while start() gathers its preparation data."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main
