"""`fuzzattn replay`: a verdict table for regression files, on every implementation that
supports their case and on the kernel each file records by its impl_spec (or only on the --impl
ones). A bad file is one failing row, never a crash."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from fuzzattn.campaigns.outcome import FAIL, SKIP, Outcome
from fuzzattn.cli import common, tables, workers


def add_parser(commands) -> None:
    p = commands.add_parser("replay", help="replay regression files",
                            description="Replay regression files against every registered "
                                        "implementation that supports their case and the kernel "
                                        "each file names by its impl_spec (or only --impl ones).")
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                   help="regression files or directories of *.json")
    p.add_argument("--impl", action="append", default=[], metavar=common.IMPL_METAVAR,
                   help="replay only against these implementations; repeatable")
    p.add_argument("--workers", type=workers.workers_arg, default="auto", metavar="N|auto",
                   help="replay the files side by side over N worker processes (auto: as for fuzz; "
                        "default: auto)")
    common.isolation_options(p)
    p.set_defaults(run=run)


def file_paths(paths) -> list[Path]:
    from fuzzattn.campaigns.regression_file import discover
    found = []
    for path in paths:
        if path.is_dir():
            found += discover(path)
        elif path.exists():
            found.append(path)
        else:
            raise common.CLIError(f"{path}: no such file or directory")
    seen, unique = set(), []
    for path in found:              # a file also named through its folder is replayed once
        if path.resolve() not in seen:
            seen.add(path.resolve())
            unique.append(path)
    return unique


def any_needs_isolation(paths) -> bool:
    """Some file records a hang, segfault or device_fault: an outside implementation must then
    be probed in a worker too (the probe call could be the one that dies). Unreadable files are
    left for replay_all to report."""
    from fuzzattn.campaigns.regression_file import RegressionFileError, load
    from fuzzattn.campaigns.file_replay import needs_isolation
    for path in paths:
        try:
            if needs_isolation(load(path)):
                return True
        except RegressionFileError:
            continue
    return False


def smallest_first(paths) -> list:
    """The files by the size of their case (its multiply-adds), smallest first, so a replay cut
    by a deadline leaves out the fewest: a campaign on a GPU saves cases large enough to take
    seconds each under the CPU interpreter. A file that does not load goes first (its row is an
    error whatever the budget)."""
    from fuzzattn.campaigns.regression_file import RegressionFileError, load

    def size(path) -> int:
        try:
            return load(path).case.macs
        except RegressionFileError:
            return -1
    return sorted(paths, key=size)


def replay_all(paths, subjects, *, only_given: bool, progress, isolate: bool = False,
               timeout: float | None = None, outcomes: list | None = None,
               processes=None, given: tuple = (), probe_isolated: bool = False,
               one_file_too: bool = False, recorded: bool = False,
               deadline: float | None = None) -> list[Outcome]:
    """Replay each file on each supporting subject; a file that cannot be read is one failing row.
    With `isolate`, and always for a file recording hang/segfault/device_fault, a file is judged
    in an isolated worker process (one per implementation, reused across files).

    `processes` (a cli.workers.Pool of several) replays the files side by side, one file
    a task, the rows in the files' order: on a CUDA host most of a replay is compiling, one
    kernel per shape, which one process does in turn (the gate's 74 files took 94 s there).
    Each worker resolves the subjects again: the registered ones unless `only_given`, and the
    `given` --impl specs (probed isolated with `probe_isolated`). A single file is replayed here,
    unless `one_file_too` (the gate, whose workers start for its campaigns anyway): in a worker,
    a crash costs that worker, not the command and the campaigns after it. `recorded`: a file
    whose kernel is not among the subjects is also replayed on it, loaded by its impl_spec.
    `deadline` (time.monotonic(), one clock for every process of the machine): a file, or a
    file's judgement on one implementation, not begun by then is a skip row."""
    from fuzzattn.isolation.pool import DEFAULT_TIMEOUT, WorkerPool
    outcomes = [] if outcomes is None else outcomes      # filled as files are replayed
    if processes is not None and processes.n > 1 and (len(paths) > 1 or one_file_too and paths):
        return _replay_over(processes, paths, subjects, only_given=only_given, progress=progress,
                            isolate=isolate, timeout=timeout, outcomes=outcomes, given=given,
                            probe_isolated=probe_isolated, recorded=recorded, deadline=deadline)
    with WorkerPool(timeout or DEFAULT_TIMEOUT) as pool:
        return _replay_all(paths, subjects, only_given=only_given, progress=progress,
                           pool=pool, isolate=isolate, outcomes=outcomes, recorded=recorded,
                           deadline=deadline)


def not_replayed(subject: str) -> Outcome:
    return Outcome("replay", subject, SKIP, True, skipped=True,
                   detail="not replayed: the replay's share of the budget was spent")


@dataclasses.dataclass(frozen=True)
class ReplayTask:
    """One file to replay in a worker process (picklable: names and flags only)."""
    path: str
    given: tuple[str, ...]          # the --impl specs, resolved again in the worker
    only_given: bool                # else the registered implementations are subjects too
    isolate: bool
    probe_isolated: bool
    timeout: float | None
    cwd: str
    env: dict
    recorded: bool = False          # replay_all's
    deadline: float | None = None   # replay_all's


_isolated = None            # a worker's isolated judges, kept across its tasks


def replay_task(task: ReplayTask) -> list[Outcome]:
    """The worker side: one file on its subjects, as _replay_all does it in one process."""
    global _isolated
    from multiprocessing import util
    from fuzzattn.isolation.pool import DEFAULT_TIMEOUT, WorkerPool
    workers.adopt(task.cwd, task.env)
    given = [workers.resolved(spec, task.probe_isolated, task.timeout) for spec in task.given]
    subjects = ([] if task.only_given else common.registered()) + given
    if _isolated is None:
        _isolated = WorkerPool(task.timeout or DEFAULT_TIMEOUT)
        # run as the worker exits, before its daemonic children are ended: their logs go too
        util.Finalize(None, _isolated.close, exitpriority=10)
    return _replay_all([Path(task.path)], subjects, only_given=task.only_given,
                       progress=_Silent(), pool=_isolated, isolate=task.isolate, outcomes=[],
                       recorded=task.recorded, deadline=task.deadline)


class _Silent:
    def status(self, text: str) -> None:
        pass

    def clear(self) -> None:
        pass


def _slow_first(paths, subjects) -> list[int]:
    """The files' indices, those judged in an isolated worker on some subject first: each starts
    a fork server and a worker of its own (a CUDA context, a compile), and submitted late it can
    only end late: such files made the tail of a GPU gate's replay."""
    from fuzzattn.campaigns.regression_file import RegressionFileError, load
    from fuzzattn.campaigns.file_replay import needs_isolation

    def slow(path) -> bool:
        try:
            record = load(path)
        except RegressionFileError:
            return False
        return any(needs_isolation(record, impl) for impl in subjects)
    return sorted(range(len(paths)), key=lambda i: not slow(paths[i]))


def _replay_over(processes, paths, subjects, *, only_given, progress, isolate, timeout, outcomes,
                 given, probe_isolated, recorded=False, deadline=None) -> list[Outcome]:
    import os
    order = _slow_first(paths, subjects)
    paths = [paths[i] for i in order]               # submitted in this order, reported in the files'
    tasks = [ReplayTask(str(path), tuple(given), only_given, isolate, probe_isolated, timeout,
                        os.getcwd(), dict(os.environ), recorded, deadline) for path in paths]
    results: list = [None] * len(paths)         # None: not replayed (stopped before it)
    try:
        processes.each(replay_task, tasks, lambda done: f"replay {done}/{len(paths)} "
                       f"({processes.n} workers)", results, deadline=deadline)
        lost = [path for path, result in zip(paths, results) if result is workers.DIED]
        if lost:    # a worker died: the files it held are replayed here, each isolated
            again: dict[str, list] = {}
            for outcome in replay_all(lost, subjects, only_given=only_given, progress=progress,
                                      isolate=True, timeout=timeout):
                again.setdefault(outcome.subject.partition(" on ")[0], []).append(outcome)
            results = [again.get(path.name, []) if result is workers.DIED else result
                       for path, result in zip(paths, results)]
    finally:        # stopped too: the files replayed so far, in the files' order
        for j in sorted(range(len(paths)), key=order.__getitem__):
            path, result = paths[j], results[j]
            if isinstance(result, list):
                outcomes += result
            elif isinstance(result, BaseException):     # the task raised; verdicts are rows already
                text = f"{path.name}: {common.flattened(result)}"
                outcomes.append(Outcome("replay", path.name, FAIL, False, detail=text, message=text))
            elif deadline is not None and time.monotonic() > deadline:
                outcomes.append(not_replayed(path.name))
        progress.clear()
    return outcomes


def _replay_all(paths, subjects, *, only_given, progress, pool, isolate, outcomes,
                recorded=False, deadline=None) -> list[Outcome]:
    from fuzzattn.campaigns.regression_file import RegressionFileError, load
    from fuzzattn.campaigns.file_replay import needs_isolation, replay_one
    from fuzzattn.platform import flight
    from fuzzattn.run.execute import one_line
    flight.set_context()        # no campaign: a crash here is the file's row, not a case to shrink
    for n, path in enumerate(paths, 1):
        name = path.name
        if deadline is not None and time.monotonic() > deadline:
            outcomes.append(not_replayed(name))
            continue
        progress.status(f"replay {n}/{len(paths)} {name}")
        try:
            record = load(path)
        except RegressionFileError as exc:
            text = common.flattened(exc)
            outcomes.append(Outcome("replay", name, FAIL, False, detail=text, message=text))
            continue
        targets = [impl for impl in subjects
                   if only_given or impl.supports(record.case) or impl.name in record.expected_failures]
        if recorded and record.impl_spec and all(i.name != record.impl for i in subjects):
            try:                # the kernel in a file the regression file names, not registered
                targets.append(_recorded(record))
            except common.CLIError as exc:
                text = f"{name}: {exc}"
                outcomes.append(Outcome("replay", name, FAIL, False, detail=text, message=text))
                continue
        if not targets:
            outcomes.append(Outcome("replay", name, SKIP, True, skipped=True,
                                    detail=f"no implementation declares {record.case}"))
        for impl in targets:
            why = impl.caps.why_not(record.case)
            if why is not None:       # named with --impl but outside its declaration
                outcomes.append(Outcome("replay", f"{name} on {impl.name}", SKIP, True, skipped=True,
                                        detail=f"{impl.name} does not declare {why}"))
                continue
            if deadline is not None and time.monotonic() > deadline:
                outcomes.append(not_replayed(f"{name} on {impl.name}"))   # each one a compile
                continue
            start = time.perf_counter()
            try:
                judge_fn = pool.get(impl).judge if isolate or needs_isolation(record, impl) else None
                outcome = replay_one(record, impl, judge_fn=judge_fn)
            except Exception as exc:   # e.g. a case over the memory budget: this file fails, the rest run
                text = f"{name}: {one_line(exc)}"
                outcome = Outcome("replay", f"{name} on {impl.name}", FAIL, False, detail=text, message=text)
            outcome.seconds = time.perf_counter() - start
            outcomes.append(outcome)
    progress.clear()
    return outcomes


def _recorded(record):
    """The implementation a regression file names by its impl_spec, loaded once a process (its
    probe call in a worker when the file records a failure that ends a process)."""
    from fuzzattn import settings
    from fuzzattn.campaigns.file_replay import needs_isolation
    from fuzzattn.run.loader import ImplementationLoadError
    try:
        return settings.load_outside(record.replay_spec(), isolated=needs_isolation(record))
    except ImplementationLoadError as exc:
        raise common.CLIError(f"{exc} (the file's impl_spec)") from None


def run(args) -> int:
    paths = file_paths(args.paths)
    isolate, timeout = common.isolation(args)
    probe_isolated = isolate or any_needs_isolation(paths)
    subjects = ([common.resolve(spec, probe_isolated, timeout) for spec in args.impl]
                or common.registered())
    if not paths:
        print(f"no regression files under {', '.join(str(p) for p in args.paths)}")
        return 0
    # Stopped from outside (a CI step's timeout sends SIGTERM, ^C sends SIGINT), the files
    # replayed so far are still reported: a long replay cut short must not print nothing.
    outcomes: list[Outcome] = []
    stopped = None
    progress = tables.Progress()
    with common.stop_on_sigterm(), workers.Pool(workers.resolve_count(args.workers), progress) as pool:
        try:
            replay_all(paths, subjects, only_given=bool(args.impl), progress=progress,
                       isolate=isolate, timeout=timeout, outcomes=outcomes, processes=pool,
                       given=tuple(args.impl), probe_isolated=probe_isolated,
                       recorded=not args.impl)
        except (KeyboardInterrupt, common.Terminated) as exc:
            stopped = "SIGTERM" if isinstance(exc, common.Terminated) else "SIGINT"
            pool.close(now=True)
    rows = []
    for o in outcomes:
        file, _, impl = o.subject.partition(" on ")
        failure = o.judged.first_failure if o.judged is not None else None
        numbers = (f"{failure.error:.3g} / {failure.allowed:.3g}" if failure is not None
                   and failure.error is not None and failure.allowed is not None else "")
        check = failure.check if failure is not None else ("malformed" if o.judged is None
                                                           and o.verdict == FAIL else "")
        rows.append([file, impl or "-", o.verdict, check, numbers,
                     o.detail if o.verdict == SKIP or check == "malformed" else ""])
    print(tables.table(("file", "impl", "verdict", "check", "error / allowed", "detail"), rows,
                       max_width=100))
    if stopped is not None:
        replayed = len({o.subject.partition(" on ")[0] for o in outcomes})
        common.finish(outcomes, f"stopped by {stopped} after {replayed} of {len(paths)} regression "
                                f"file(s): {tables.totals(outcomes)}")
        return 130 if stopped == "SIGINT" else 143
    return common.finish(outcomes, f"{len(paths)} regression file(s): {tables.totals(outcomes)}")
