"""torch.compile's compile pools end with the process, within seconds, even when one is stuck
(fuzzattn/platform/compile_pools.py)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import fuzzattn  # noqa: F401  -- selects the Triton backend before inductor imports triton
from fuzzattn.platform import compile_pools

# A pool as inductor keeps one, whose process never stops: its shutdown() waits on it, as a
# SubprocPool's does (up to 300 s) when a compile worker hangs. Its process has a child of its
# own (a compile worker). Both sleep for 600 s on purpose: they stand for a hung compile, which
# release() must kill rather than wait for.
STUCK = textwrap.dedent("""
    import subprocess, sys
    import torch._inductor.async_compile as inductor

    class StuckPool:
        def __init__(self):
            self.process = subprocess.Popen([sys.executable, "-c",
                "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                "'import time; time.sleep(600)']); time.sleep(600)"])

        def shutdown(self):
            self.process.wait(300)

    pool = StuckPool()
    inductor._pool_set.add(pool)
""")


def _wait_for(condition, seconds: float, what: str) -> None:
    """Poll until condition() holds; fail naming `what` after `seconds`. The deadlines below
    are generous on purpose: starting a Python process or delivering a SIGKILL takes well under
    a second, but seconds on a loaded CI host, and only a deadline missed by far means a bug."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} after {seconds} s"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1][:1]
    except OSError:
        return False
    return state != "Z"


def test_a_real_compile_pool_stops_by_itself_and_is_forgotten():
    import torch._inductor.async_compile as inductor
    from torch._inductor.compile_worker.subproc_pool import SubprocPool
    pool = SubprocPool(2)
    inductor._pool_set.add(pool)
    assert pool.submit(int, "7").result(timeout=120) == 7
    assert compile_pools.release() == 0
    # it ends at once; the deadline only keeps a pool that does not from hanging the suite
    assert pool.process.wait(60) == 0 and not inductor._pool_set


def test_a_stuck_pool_is_killed_with_its_workers_after_the_grace():
    namespace: dict = {}
    exec(STUCK, namespace)
    pool = namespace["pool"]
    _wait_for(lambda: compile_pools._children(pool.process.pid), 60, "no compile worker started")
    worker = compile_pools._children(pool.process.pid)
    started = time.monotonic()
    assert compile_pools.release(grace=0.5) == 1
    # The grace and a kill: a fraction of a second, seconds on a loaded host; what this tells
    # apart is waiting on the pool (300 s, inductor's own shutdown), so 60 s is no weaker.
    assert time.monotonic() - started < 60
    assert pool.process.wait(60) == -9
    # SIGKILL is delivered asynchronously: on a loaded host the worker was seen running just after
    _wait_for(lambda: not any(_alive(pid) for pid in worker), 60, f"compile worker {worker} alive")


def test_a_process_that_registered_ends_without_waiting_on_a_stuck_pool():
    """Inductor's own atexit handler would wait 300 s on the stuck pool: release() runs first."""
    program = "import fuzzattn\nfrom fuzzattn.platform import compile_pools\n" + STUCK + \
        "compile_pools.GRACE = 0.5\ncompile_pools.release_at_exit()\nprint(pool.process.pid, flush=True)\n"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 60, "waited on the stuck pool"
    assert not _alive(int(done.stdout.split()[0]))
