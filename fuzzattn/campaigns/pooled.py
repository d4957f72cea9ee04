"""The run's worker pool for `check_case`: the pytest plugin's --fuzzattn-isolate judges the
run's implementations in worker processes (fuzzattn.isolation.supervisor.WorkerPool); tests
calling check_case need not know."""
from __future__ import annotations

# The pool and the implementations it covers (by cli_name), or None: set by use_workers, read
# by check_case through run_judge.
_workers: tuple | None = None


def use_workers(pool, covers) -> tuple | None:
    """Judge `check_case` calls for implementations named in `covers` (cli names) through `pool`
    (None: in-process again); returns the previous setting, to restore it. Implementations a test
    builds for itself stay in-process: a worker could not import them by name."""
    global _workers
    previous, _workers = _workers, (pool, frozenset(covers)) if pool is not None else None
    return previous


def run_judge(impl):
    """How check_case judges `impl` in this run: a pooled worker's judge, or None (in-process)."""
    if _workers is None or impl.cli_name not in _workers[1]:
        return None
    return _workers[0].get(impl).judge
