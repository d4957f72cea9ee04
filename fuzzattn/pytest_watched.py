"""A pytest run with the plugin, watched: started from the command line, the run re-executes
itself in a child that its watchdog watches (fuzzattn/isolation/watchdog.py), so a kernel that
hangs or kills a process loses no case. Each crash is saved as a regression file (hang, segfault
or device_fault) and printed with its replay command; under pytest-xdist the run goes on in a
fresh worker, without it the run ends there. The exit status is 1 when anything crashed.

Not watched: a run started inside another process (pytester, `pytest.main`), an xdist worker,
--help / --version / --collect-only, and FUZZATTN_SUPERVISE=off.
"""
from __future__ import annotations

import os
import sys

OFF_ENV = "FUZZATTN_SUPERVISE"


def _from_the_command_line(config) -> bool:
    name = os.path.basename(sys.argv[0] or "")
    started = name in ("pytest", "py.test") or sys.argv[0].endswith(os.path.join("pytest", "__main__.py"))
    return started and tuple(sys.argv[1:]) == tuple(config.invocation_params.args)


def _as_a_module() -> bool:
    return sys.argv[0].endswith(os.path.join("pytest", "__main__.py"))


def should_watch(config) -> bool:
    from fuzzattn.platform import flight
    option = config.option
    return not (flight.watched_here() or hasattr(config, "workerinput")
                or os.environ.get(OFF_ENV, "").lower() in ("0", "off", "no", "false")
                or getattr(option, "help", False) or getattr(option, "version", False)
                or getattr(option, "collectonly", False) or not _from_the_command_line(config))


def run_watched(config, regressions_dir) -> int:
    """The whole run again, watched; its exit status, or 1 when a case crashed."""
    from fuzzattn.cli.watched import save_crash
    from fuzzattn.isolation import watchdog
    timeout = config.getoption("fuzzattn_timeout")
    isolate = config.getoption("fuzzattn_isolate") or timeout is not None
    # The child's sys.path is this process's: the working directory on it only when this run
    # was started as `python -m pytest`, which put it there.
    child = watchdog.python_command("pytest", "main", list(config.invocation_params.args),
                                    keep_working_directory=_as_a_module())
    ending = watchdog.run_watched(child, cwd=str(config.invocation_params.dir), stop_at_first=False,
                                  timeout=None if isolate else timeout)
    for crash in ending.crashes:
        save_crash(crash, directory=regressions_dir)
    if ending.died and not ending.crashes:
        print(f"fuzzattn: {ending.died}", file=sys.stderr)
    if ending.crashes:
        return max(1, ending.returncode)
    return ending.returncode if ending.returncode >= 0 else 1


def watch_this_process() -> None:
    """In the processes of a watched run (the child, each xdist worker): Python stacks written
    where the watchdog reads them."""
    from fuzzattn.isolation.watchdog import install_fault_log
    install_fault_log()
