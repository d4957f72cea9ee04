"""`--workers N|auto` (fuzz, gate): one campaign per implementation and dtype, spread over N worker
processes that draw different cases, reported as one campaign.

Worker i of N draws with Hypothesis seed `seed * N + i` and judges its share of --max-examples;
--seconds is the campaign's wall time, every worker's from when its implementation is loaded. Every
worker replays and saves in the same example database (fuzzattn/campaigns/example_db.py), judges
exactly as the single-process path does (common.campaign_outcome: the profile, gradients on every
case, the compile palette of its seed) and shrinks and saves what it finds; the parent shows one
progress line, merges the parts into one Outcome, and lists each distinct failure once (two
workers that shrink to the same case share its regression file). The "found by" command of a
failure reruns the one worker that found it, in one process.

The processes come from a ProcessPoolExecutor started once per command and reused by every
campaign: a fork server without CUDA, spawn where CUDA is visible (a process that has touched CUDA
cannot fork). Each worker on a CUDA host sees one GPU, round robin, and keeps its own flight record
(flight.adopt): a worker that dies or hangs is a segfault / hang verdict, its case saved and shrunk.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import functools
import multiprocessing
import os
import signal
import threading
import time
import warnings
from concurrent.futures.process import BrokenProcessPool as _Broken

from fuzzattn.campaigns.outcome import Outcome
from fuzzattn.cli import common, merged

# --workers auto on a CUDA host: processes per visible GPU (at most one per core); several overlap
# their host phases with each other's kernels; past one worker a core the total falls
# (benchmarks/REPORT.md, its SDPA-over-workers row; benchmarks/throughput.py --cli-workers).
PER_GPU = 16
# --workers auto without CUDA: one process per core up to this (past a handful, the fork server's
# start-up and each worker's shrink of a shared failure cost more than they return)
CPU_CAP = 8
POLL = 0.1              # seconds between looks at the workers (and progress redraws)
START_LIMIT = 300.0     # seconds a worker waits for the others to start (CUDA, imports)
DIED = "died"           # Pool.each's answer for a task whose worker process died


def workers_arg(text: str):
    """argparse type: a whole number >= 1, or 'auto' (or fuzz's default, AUTO_ON_GPU)."""
    if text in ("auto", AUTO_ON_GPU):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number or auto") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1 (or auto)")
    return value


def add_options(p: argparse.ArgumentParser, default) -> None:
    """--workers and --database."""
    p.add_argument("--workers", type=workers_arg, default=default, metavar="N|auto",
                   help="worker processes per campaign, each drawing different cases (auto: "
                        f"{PER_GPU} per visible GPU up to one per core, else one per core up to "
                        f"{CPU_CAP}; inside a pytest-xdist worker, its share of the cores; default: "
                        f"{default})")
    p.add_argument("--database", metavar="DIR|redis://HOST:PORT[/DB]|off",
                   help="the Hypothesis example database whose saved failures are replayed first "
                        "and where new ones go; share one between runs, workers and hosts "
                        "(default: FUZZATTN_DATABASE, else .fuzzattn/examples beside the "
                        "regressions directory)")


def visible_gpus() -> list[str]:
    """The CUDA devices this process sees, as CUDA_VISIBLE_DEVICES entries ([] without CUDA)."""
    import torch
    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed:
        return [d.strip() for d in listed.split(",") if d.strip()][:torch.cuda.device_count()]
    return [str(i) for i in range(torch.cuda.device_count())]


def cores() -> int:
    """The cores `auto` may fill: the machine's, or a pytest-xdist worker's share of them. Its
    neighbours run their own tests side by side: a gate test under `pytest -n auto` that took
    every core would start a worker a core, each paying CUDA's start-up."""
    count = os.cpu_count() or 1
    if os.environ.get("PYTEST_XDIST_WORKER"):
        count //= max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    return max(1, count)


# fuzz's default: compile-bound in one process on a GPU host (a Triton kernel compiles per
# variant), so the machine; on the CPU one process, for debugging as for the interpreter.
AUTO_ON_GPU = "auto on a GPU host, else 1"


def resolve_count(value) -> int:
    """The number of worker processes `--workers VALUE` asks for here."""
    if value == AUTO_ON_GPU:
        value = "auto" if visible_gpus() else 1
    if value != "auto":
        return int(value)
    gpus = visible_gpus()
    return max(1, min(PER_GPU * len(gpus), cores()) if gpus else min(cores(), CPU_CAP))


@dataclasses.dataclass(frozen=True)
class Share:
    """One worker's part of a campaign (picklable: only names and numbers)."""
    slot: int
    spec: str                       # the implementation's cli name: registered, or FILE.py:NAME
    dtype: str | None
    profile: str
    max_examples: int | None        # None: the deadline alone ends the share
    deadline: float | None          # time.monotonic() (system-wide on Linux) when it must stop
    hypothesis_seed: int
    save: bool
    regressions_dir: str | None
    isolate: bool
    timeout: float | None
    database: str | None            # an example_db spec, opened in the worker
    stage: str
    options: dict                   # further keyword arguments of common.campaign_outcome
    cwd: str                        # the parent's, and its environment: a fork server's
    env: dict                       # children start with the server's own


# -- the worker side ----------------------------------------------------------------------------
_counts = None          # the pool's shared counters: judged, refused and drawn per slot
_all_up = None          # the pool's barrier: every worker's start-up task waits at it


def _start(watched: bool, gpus: list[str], counter, counts, all_up, n: int = 1) -> None:
    """Each worker's set-up: the watchdog's flight record, its GPU, the judging settings of
    fuzzattn.cli.main (Triton backend, warning filters), and its share of the CPU's threads."""
    global _counts, _all_up
    from fuzzattn import settings
    from fuzzattn.platform import compile_pools, flight
    if watched:
        from fuzzattn.isolation import watchdog
        flight.adopt()
        watchdog.install_fault_log()
    with counter.get_lock():
        index, counter.value = counter.value, counter.value + 1
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index % len(gpus)]
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # ^C reaches the group: the parent stops us
    if watched:     # a broken pool terminates its other workers: their calls are no findings
        flight.abandon_on_sigterm()
    compile_pools.release_at_exit()
    settings.choose_backend()
    settings.check_environment()
    if threads := settings.threads_per_process(n):
        import torch
        torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
    warnings.filterwarnings("ignore", message="Conversion of an array with ndim > 0 to a scalar",
                            category=DeprecationWarning)
    import fuzzattn.kernels  # noqa: F401  (spawned: the registry's imports, its GPU's probes)
    _picklable_counterexamples()
    _counts, _all_up = counts, all_up


def _ready(limit: float) -> int:
    """Hold this worker until every worker has set itself up (each of the n start-up tasks has
    its own process); its pid. The barrier comes through the initializer, not in a task."""
    with contextlib.suppress(threading.BrokenBarrierError):    # one did not start: its death,
        _all_up.wait(limit)                                      # the campaign's to report
    # one case judged before any campaign's clock: a forked worker's first judgement pays for
    # the pages it shares with the fork server, a spawned one's for torch's lazy set-up
    from fuzzattn.isolation import preload
    with contextlib.suppress(Exception):
        preload._warm()
    return os.getpid()


class _SharedCounts:
    """What run_campaign's progress does in a worker: publish the counts to the parent."""

    def __init__(self, slot: int):
        self.slot = slot

    def track(self, strategy, label, budget, *, cap=None, counts=None):
        def note(case):
            _counts[3 * self.slot:3 * self.slot + 3] = list(counts())
            return case
        return strategy.map(note)

    def clear(self) -> None:          # nothing drawn on a worker's terminal
        return None


def adopt(cwd: str, env: dict) -> None:
    """A task's working directory and environment, the parent's (a fork server's children start
    with the server's own), keeping this worker's GPU."""
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu


# A worker's implementations, each loaded (imported, probed) once for all of its tasks.
resolved = functools.cache(common.resolve)


def _run_share(share: Share) -> Outcome:
    from fuzzattn.campaigns import example_db
    picked_up = time.monotonic()
    adopt(share.cwd, share.env)
    profile = common.load_profile(share.profile)
    # Loading is start-up, as the pool's: the share's clock starts once the implementation is ready.
    impl = resolved(share.spec, share.isolate, share.timeout)
    seconds = None if share.deadline is None else max(share.deadline - picked_up, 0.01)
    database = example_db.open_database(share.database) if share.database else None
    outcome = common.campaign_outcome(
        impl, share.dtype, profile=profile, max_examples=share.max_examples, seconds=seconds,
        hypothesis_seed=share.hypothesis_seed, save=share.save, regressions_dir=share.regressions_dir,
        progress=_SharedCounts(share.slot), stage=share.stage, isolate=share.isolate,
        timeout=share.timeout, database=database, **share.options)
    return outcome          # pickled whole: Counterexample by _reduce_counterexample


def _reduce_counterexample(found):
    return type(found), (found.judged, found.written)


def _picklable_counterexamples() -> None:
    """A Counterexample pickles as (judged case, written file): its message is rebuilt."""
    import copyreg
    from fuzzattn.campaigns.campaign import Counterexample
    copyreg.pickle(Counterexample, _reduce_counterexample)


# -- the parent side ----------------------------------------------------------------------------
class _Ticker:
    """A stand-in strategy for Progress.track: its .map gives the per-draw callback, which the
    parent calls on every look at its workers (the progress line is the single-process one)."""

    @staticmethod
    def map(function):
        return function


class Pool:
    """N worker processes for the campaigns of one command (started on first use)."""

    def __init__(self, n: int, progress=None):
        self.n = n
        self.progress = progress
        self.ready_pids: list[int] = []     # the workers that finished start-up, one task each
        self._executor = None
        self._gpus: list[str] = []

    def _ensure(self):
        if self._executor is None:
            from fuzzattn.platform import flight
            self._gpus = visible_gpus()
            if self._gpus:
                context = multiprocessing.get_context("spawn")
            else:
                context = multiprocessing.get_context("forkserver")
                # the isolation workers' fork server too (one per process): warm, and registered
                context.set_forkserver_preload(["fuzzattn.isolation.preload", "fuzzattn.cli.workers",
                                                "fuzzattn.kernels"])
            self._counts = context.Array("q", 3 * self.n, lock=False)
            self._counter = context.Value("i", 0)
            self._executor = concurrent.futures.ProcessPoolExecutor(
                self.n, mp_context=context, initializer=_start,
                initargs=(flight.watched_here(), self._gpus, self._counter, self._counts,
                          context.Barrier(self.n), self.n))
            if self.progress is not None:
                self.progress.status(f"starting {self.n} worker processes")
            from fuzzattn.isolation.starting import main_module_hidden
            with main_module_hidden():     # spawn: a script's __main__ is not run again
                up = [self._executor.submit(_ready, START_LIMIT) for _ in range(self.n)]
            concurrent.futures.wait(up)
            # a worker that died starting is the first campaign's to report; anything else is ours
            self.ready_pids = [f.result() for f in up if not isinstance(f.exception(), _Broken)]
        return self._executor

    def start(self) -> None:
        """Start the worker processes now (they otherwise start with the first campaign)."""
        if self.n > 1:
            self._ensure()

    def close(self, *, now: bool = False) -> None:
        if self._executor is None:
            return
        if now:          # stopped (^C, SIGTERM): end the workers' campaigns where they are
            for process in list((getattr(self._executor, "_processes", None) or {}).values()):
                process.terminate()
        self._executor.shutdown(wait=not now, cancel_futures=True)
        self._executor = None

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        self.close(now=kind is not None)

    def each(self, function, tasks: list, status, results: list, deadline: float | None = None) -> None:
        """function(task) for every task over the workers, each answer put in `results` at its
        task's index as it comes (so a caller stopped by ^C keeps what finished): its result,
        the exception it raised, or DIED where its worker died (the pool is then closed, and
        started again by its next use). `status(done)` is the progress line's text. Tasks not
        started by `deadline` (time.monotonic()) are not run: their results stay as given."""
        executor = self._ensure()
        futures = {executor.submit(function, task): i for i, task in enumerate(tasks)}
        pending, broken = set(futures), False
        while pending:
            if deadline is not None and time.monotonic() > deadline:
                pending = {f for f in pending if not f.cancel()}     # the running ones finish
            done, pending = concurrent.futures.wait(pending, timeout=POLL)
            for future in done:
                try:
                    results[futures[future]] = future.result()
                except _Broken:
                    results[futures[future]], broken = DIED, True
                except Exception as exc:
                    results[futures[future]] = exc
            if self.progress is not None:
                self.progress.status(status(len(futures) - len(pending)))
        if broken:
            self.close(now=True)

    def run_campaign(self, impl, dtype, *, profile, max_examples: int | None, seconds: float | None,
                     hypothesis_seed: int, save: bool, regressions_dir, progress, database: str | None,
                     isolate: bool = False, timeout: float | None = None, stage: str = "fuzz",
                     **options) -> Outcome:
        """common.campaign_outcome's Outcome for one campaign judged by the pool's workers."""
        label = f"{impl.name} {dtype or 'all dtypes'}"
        n = self.n if max_examples is None else min(self.n, max_examples)
        executor = self._ensure()           # start-up is not the campaign's time
        start = time.perf_counter()
        deadline = None if seconds is None else time.monotonic() + seconds
        shares = [Share(i, impl.cli_name, dtype, profile.name,
                        None if max_examples is None else max_examples // n + (i < max_examples % n),
                        deadline, hypothesis_seed * n + i, save,
                        None if regressions_dir is None else str(regressions_dir), isolate, timeout,
                        database, stage, dict(options, shards=n), os.getcwd(), dict(os.environ))
                  for i in range(n)]      # shards=n: palettes rotating by n never meet
        self._counts[:3 * self.n] = [0] * (3 * self.n)

        def counts():
            return tuple(sum(self._counts[j:3 * n:3]) for j in range(3))

        tick = progress.track(_Ticker(), f"{stage} {label} ({n} workers)", max_examples,
                              cap=seconds, counts=counts)
        futures = [executor.submit(_run_share, s) for s in shares]
        while concurrent.futures.wait(futures, timeout=POLL).not_done:
            tick(None)
        progress.clear()
        parts, problems, lost = [], [], []
        for share, future in zip(shares, futures):
            try:
                parts.append(future.result())
            except _Broken:
                lost.append(share)
            except Exception as exc:        # e.g. the implementation could not be loaded there
                problems.append(f"worker {share.slot}: {type(exc).__name__}: {common.flattened(exc)}")
        if lost:
            # One death breaks the whole executor: every unfinished share is lost with it.
            from fuzzattn.platform import flight
            self.close(now=True)
            problems.insert(0, f"a worker process died, and {len(lost)} of {n} shares with it "
                               f"(hypothesis seeds {', '.join(str(s.hypothesis_seed) for s in lost)})"
                               + (": the watchdog saves the case it was judging" if flight.watched_here()
                                  else "; run the fuzzattn command (watched) or --isolate to keep "
                                       "its case"))
        return merged.merge(stage, label, parts, problems, time.perf_counter() - start,
                            max_examples=max_examples, seconds=seconds, caps=impl.caps)


def open_database(value: str | None, regressions_dir) -> tuple[object, str | None]:
    """(the example database, its spec for workers) that --database VALUE names, else
    FUZZATTN_DATABASE, else the default; a bad one is a usage error, before anything runs."""
    from fuzzattn.campaigns import example_db
    spec, source = example_db.choose(value, regressions_dir)
    try:
        database = example_db.open_database(spec, source)
    except example_db.DatabaseError as exc:
        raise common.CLIError(str(exc)) from None
    if database is None:
        return None, None
    # a directory database's own path: the default may have fallen back to another directory
    return database, spec if "://" in spec else os.path.abspath(getattr(database, "path", spec))


def run_campaign(pool: Pool | None, impl, dtype, *, database: tuple, **kw) -> Outcome:
    """The campaign in this process (no pool, or one worker) or over the pool's workers;
    `database` as open_database gives it."""
    if pool is None or pool.n == 1:
        return common.campaign_outcome(impl, dtype, database=database[0], **kw)
    return pool.run_campaign(impl, dtype, database=database[1], **kw)
