"""torch.compile's compile-worker pools, stopped at exit without waiting on them for minutes.

Inductor (FlexAttention's per-shape compiles) starts a pool of compile processes in each process
that compiles, and at exit waits up to 300 s for each pool to shut down. A 16-worker pytest
run had reported its last test while several xdist workers still sat in that wait
(docs/CALIBRATION.md#compiles). A process of ours
that ends (a pytest process, a fuzzattn command, a --workers process) asks its pools to stop
first, waits GRACE seconds, then kills what is left: nothing is compiled any more, so nothing is
lost. Before atexit: inductor's own handler, registered when it is imported, would otherwise
run first.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

GRACE = 5.0         # seconds a pool gets to stop by itself (an idle pool stops in well under one)
_registered: int | None = None      # the pid that registered release(): once per process


def release(grace: float | None = None) -> int:
    """Stop every compile pool of this process, killing the ones still running after `grace`
    seconds (default GRACE) and the processes they started; the number killed."""
    grace = GRACE if grace is None else grace
    module = sys.modules.get("torch._inductor.async_compile")
    pools = list(getattr(module, "_pool_set", ()) or ())
    killed = 0
    for pool in pools:
        stopping = threading.Thread(target=_shut_down, args=(pool,), daemon=True)
        stopping.start()
        stopping.join(grace)
        if stopping.is_alive():
            for pid in _processes_of(pool):
                _kill_tree(pid)
            killed += 1
            stopping.join(grace)
    if pools:
        with contextlib.suppress(Exception):
            module.after_fork()          # forgets them: inductor's handler then finds none
    return killed


def release_at_exit() -> None:
    """Call release() when this process ends, before the interpreter's atexit handlers."""
    global _registered
    if _registered == os.getpid():
        return
    _registered = os.getpid()
    register = getattr(threading, "_register_atexit", None)   # runs before atexit's handlers
    if register is None:
        import atexit
        register = atexit.register
    with contextlib.suppress(RuntimeError):          # already shutting down
        register(release)


def _shut_down(pool) -> None:
    with contextlib.suppress(Exception):
        pool.shutdown()


def _processes_of(pool) -> list[int]:
    """A SubprocPool's one process, or a process pool's workers."""
    process = getattr(pool, "process", None)
    if process is not None:
        return [process.pid]
    return [p.pid for p in list((getattr(pool, "_processes", None) or {}).values())]


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process below it (a compile worker may be stuck in a compiler)."""
    for child in _children(pid):
        _kill_tree(child)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    from fuzzattn.platform.flight import parent_of
    if not os.path.isdir("/proc"):
        return []
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and parent_of(int(entry)) == pid]
