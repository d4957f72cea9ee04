"""The fuzzattn pytest plugin: run settings, outside implementations, and regression files as items.

Opt-in. Installing fuzzattn registers nothing with pytest: a project enables the plugin with

    pytest -p fuzzattn.pytest_plugin            # one run
    pytest_plugins = ["fuzzattn.pytest_plugin"] # in its conftest.py (this repository does so)

so that a kernel engineer's unrelated tests, in the same environment, run exactly as before: no
Hypothesis profile loaded, no thread pinning, no environment variable set, nothing collected.

When enabled, it loads the fuzzattn profile (sizes and the Hypothesis settings profile of that
name), pins one torch thread per CPU-only xdist worker, sets up the Triton backend, adds
`--fuzzattn-impl` implementations, and collects every `*.json` in the regressions directory
(ini `fuzzattn_regressions`, default `regressions`) as one item per implementation that supports
its case (`regressions/<key>.json::sdpa`). A regression file that cannot be used is one failing
item naming the file and the field; collection itself never errors. Everything it changes is
put back at unconfigure, so a pytest run inside a test (pytester) leaves its host unchanged.

`--fuzzattn-isolate` / `--fuzzattn-timeout S` judge the run's implementations in supervised
worker processes (one per implementation per xdist worker, reused across tests): a hang, a dead
process or a CUDA fault fails that test with its verdict and the run goes on. Files recording
hang/segfault/device_fault always replay in a worker. In-process, a test after which the CUDA
context is lost fails at teardown saying so, and its xdist worker exits so that the rest run in a
fresh one (a CUDA fault is sticky). Under MPS a device fault stops the whole run
(fuzzattn/platform/shared_gpu.py).
"""
from __future__ import annotations

import collections
import os
import time
from pathlib import Path

import pytest

REGRESSIONS_INI = "fuzzattn_regressions"


def pytest_addoption(parser):
    group = parser.getgroup("fuzzattn", "differential fuzzing of attention kernels")
    group.addoption("--fuzzattn-profile", default=None,
                    help="size and budget profile: ci, dev, gpu, nightly (default: FUZZATTN_PROFILE, "
                         "else ci under CI, gpu with CUDA, dev otherwise)")
    group.addoption("--fuzzattn-max-examples", type=int, default=None, metavar="N",
                    help="cases per differential test, overriding the profile's budget")
    group.addoption("--fuzzattn-impl", action="append", default=[], metavar="FILE.py:NAME",
                    help="also fuzz and replay an implementation defined outside the repo "
                         "(a module path or file, then ':' and the object's name); repeatable")
    group.addoption("--fuzzattn-shards", type=int, default=1, metavar="N",
                    help="split each differential campaign into N tests with distinct Hypothesis "
                         "seeds and 1/N of the budget each, so pytest-xdist workers share it")
    group.addoption("--fuzzattn-isolate", action="store_true",
                    help="judge the run's implementations in supervised worker processes: a hang, a "
                         "dead process or a CUDA fault fails the test instead of ending the run")
    group.addoption("--fuzzattn-timeout", type=float, default=None, metavar="S",
                    help="per-case limit for --fuzzattn-isolate (implies it; default 60)")
    parser.addini(REGRESSIONS_INI, default="regressions",
                  help="directory (relative to the rootdir) whose *.json regression files are replayed")


class _State:
    """What pytest_configure changed, to be put back at unconfigure."""

    def __init__(self):
        from fuzzattn.campaigns.hypothesis_internals import profile_name
        self.hypothesis_profile = profile_name()
        self.env = {"FUZZATTN_PROFILE": os.environ.get("FUZZATTN_PROFILE")}
        self.threads = None
        self.outside_specs = None
        self.regressions_dir = None
        self.shards = None
        self.timeout = None                 # per case, when isolating
        self.pool = None                    # WorkerPool, started on first use
        self.workers = False                # campaign.use_workers' previous setting, if we set it

    def worker_pool(self):
        if self.pool is None:
            from fuzzattn.isolation.pool import DEFAULT_TIMEOUT, WorkerPool
            self.pool = WorkerPool(self.timeout or DEFAULT_TIMEOUT)
        return self.pool

    def restore(self):
        import torch
        from hypothesis import settings as hypothesis_settings
        from fuzzattn import settings
        if self.hypothesis_profile:
            hypothesis_settings.load_profile(self.hypothesis_profile)
        for name, value in self.env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        if self.outside_specs is not None:
            settings.set_outside_specs(self.outside_specs)
        if self.shards is not None:
            settings.set_shards(self.shards)
        from fuzzattn.campaigns import regression_file
        regression_file.set_default_dir(self.regressions_dir)
        if self.workers is not False:
            from fuzzattn.campaigns import campaign
            campaign.use_workers(*(self.workers or (None, ())))
        if self.pool is not None:
            self.pool.close()


_STATE_KEY = pytest.StashKey[_State]()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """A run started from the command line re-executes itself watched (fuzzattn/pytest_watched.py):
    a kernel that hangs or kills its process is then a saved regression file, not a lost run."""
    from fuzzattn import pytest_watched
    if pytest_watched.should_watch(config):
        return pytest_watched.run_watched(config, regressions_dir(config))
    return None


def pytest_sessionstart(session):
    """After pytest's own faulthandler set-up (at configure): a watched run's fatal-signal
    stacks go where the watchdog reads them."""
    from fuzzattn import pytest_watched
    pytest_watched.watch_this_process()


def pytest_configure(config):
    from fuzzattn import settings
    from fuzzattn.contract.profiles import PROFILES, ProfileError
    global _lost_here, _shared_fault
    _lost_here = _shared_fault = None       # a session's own (pytester runs one inside another)
    state = config.stash[_STATE_KEY] = _State()
    name = config.getoption("fuzzattn_profile") or os.environ.get("FUZZATTN_PROFILE")
    hyp = config.getoption("hypothesis_profile", default=None)
    if name is None and hyp in PROFILES:
        name = hyp
    try:
        profile = settings.load_profile(name)
    except ProfileError as exc:
        raise pytest.UsageError(str(exc)) from None
    from hypothesis import settings as hypothesis_settings
    if hyp is not None and hyp != profile.name:
        hypothesis_settings.load_profile(hyp)      # an explicit --hypothesis-profile wins for settings
    budget = config.getoption("fuzzattn_max_examples")
    if budget is not None:
        if budget < 1:
            raise pytest.UsageError(f"--fuzzattn-max-examples={budget} must be at least 1")
        hypothesis_settings.register_profile("fuzzattn-budget", parent=hypothesis_settings(),
                                             max_examples=budget)
        hypothesis_settings.load_profile("fuzzattn-budget")
    # Regression files go to <rootdir>/<fuzzattn_regressions> wherever pytest was started from
    # (FUZZATTN_REGRESSIONS_DIR, if set, still wins).
    from fuzzattn.campaigns import regression_file
    state.regressions_dir = regression_file.set_default_dir(regressions_dir(config))
    try:
        settings.choose_backend()
        settings.check_environment()
    except (settings.BackendError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None
    _pin_worker_gpu()
    from fuzzattn.platform import compile_pools
    compile_pools.release_at_exit()
    threads = settings.threads_per_process(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    if os.environ.get("PYTEST_XDIST_WORKER") and threads:
        import torch
        state.threads = torch.get_num_threads()
        torch.set_num_threads(threads)
    timeout = config.getoption("fuzzattn_timeout")
    if timeout is not None and not timeout > 0:
        raise pytest.UsageError(f"--fuzzattn-timeout={timeout:g} must be a positive number of seconds")
    state.timeout = timeout
    isolate = config.getoption("fuzzattn_isolate") or timeout is not None
    specs = config.getoption("fuzzattn_impl")
    if specs:
        from fuzzattn.run.loader import ImplementationLoadError
        for spec in specs:          # a bad spec is a one-line usage error, before any test runs
            try:                    # (isolated, the probe call runs in a worker: it may hang or die)
                settings.load_outside(spec, isolated=isolate, timeout=timeout)
            except ImplementationLoadError as exc:
                raise pytest.UsageError(str(exc)) from None
    state.outside_specs = settings.set_outside_specs(specs)
    shards = config.getoption("fuzzattn_shards")
    if shards < 1:
        raise pytest.UsageError(f"--fuzzattn-shards={shards} must be at least 1")
    state.shards = settings.set_shards(shards)
    config.stash[_START_KEY] = time.perf_counter()
    if isolate:
        from fuzzattn.campaigns import campaign
        covered = {impl.cli_name for impl in settings.implementations()}
        state.workers = campaign.use_workers(state.worker_pool(), covered)


def pytest_collection_modifyitems(items):
    """Unreadable regression files run last: under -x the run still replays every other file
    and runs every test before it stops at them."""
    from fuzzattn.pytest_regressions import BrokenFileItem
    items.sort(key=lambda item: isinstance(item, BrokenFileItem))


def pytest_collection_finish(session):
    """The test modules are imported: freeze what lives on for the session out of the garbage
    collector's full passes (fuzzattn/platform/gc_tuning.py), in each pytest-xdist worker too."""
    from fuzzattn.platform.gc_tuning import freeze_long_lived
    freeze_long_lived()


# -- how many cases this run judged (summed over pytest-xdist workers) --------------------------
_START_KEY = pytest.StashKey[float]()
_JUDGED_KEY = pytest.StashKey[int]()
_UNJUDGED_KEY = pytest.StashKey[collections.Counter]()   # _unjudged_here's, from workers


def cuda_context_lost() -> str | None:
    """Why this process's CUDA context can no longer run anything (a device fault is sticky:
    every later CUDA call fails with it), or None while it can, or was never used."""
    import sys
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
    except Exception as exc:       # torch.AcceleratorError, RuntimeError on older torch
        from fuzzattn.run.execute import one_line
        return one_line(exc)             # 'TypeName: first line of the message'
    return None


# (message, in an xdist worker): set only in the process that ran the test, not xdist's controller
_lost_here: tuple[str, bool] | None = None
# Why the session stops: a test met a device fault on a GPU shared through MPS
_shared_fault: str | None = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """After a test that lost the process's CUDA context (an in-process kernel faulted), no later
    test here can pass for a reason of its own: its teardown fails, saying so, and then
    (pytest_runtest_logreport) an xdist worker exits, so xdist starts a fresh worker for the
    rest, and a run without xdist stops. (Without this, one device fault failed every later
    test of its worker: 110 of them.) A test that met a device fault on a GPU shared through MPS
    (shared_gpu.SharedDeviceFault) stops the whole session instead, every worker with it."""
    global _lost_here, _shared_fault
    outcome = yield
    if call.when == "call" and call.excinfo is not None:
        from fuzzattn.platform.shared_gpu import SharedDeviceFault
        if call.excinfo.errisinstance(SharedDeviceFault):
            # Every later test would meet the same fault (MPS delivers it to every client, and
            # refuses new ones until they all exited): the session stops after this test, and
            # under xdist the controller stops every worker (fuzzattn/platform/shared_gpu.py).
            first_line = str(call.excinfo.value).strip().splitlines()[0][:300]
            _shared_fault = f"fuzzattn: {item.nodeid}: {first_line}"
            item.session.shouldstop = (f"{_shared_fault}; the run stops here: a device fault "
                                       "on a GPU shared through MPS may be any process's")
    if call.when != "teardown":
        return
    lost = cuda_context_lost()
    if lost is not None:
        report = outcome.get_result()
        report.outcome = "failed"
        report.longrepr = f"fuzzattn: {item.nodeid} lost this process's CUDA context ({lost})"
        _lost_here = (report.longrepr, hasattr(item.config, "workerinput"))


@pytest.hookimpl(trylast=True)      # after xdist has sent the report to the controller
def pytest_runtest_logreport(report):
    if _lost_here is None or report.when != "teardown":
        return
    message, in_worker = _lost_here
    if in_worker and _shared_fault is not None:
        return      # the session is stopping (shouldstop): xdist stops every worker with it
    if in_worker:
        os._exit(3)
    pytest.exit(f"{message}; no later test could run in this process", returncode=3)


def pytest_sessionfinish(session):
    from fuzzattn.campaigns import verdicts
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:            # an xdist worker: hand the counts to the controller
        workeroutput["fuzzattn_judged"] = verdicts.judged_total
        workeroutput["fuzzattn_unjudged"] = [[*key, n] for key, n in _unjudged_here().items()]


@pytest.hookimpl(optionalhook=True)     # pytest-xdist's hook: absent without it, and then unused
def pytest_testnodedown(node, error):
    """xdist controller: add up the workers' counts of judged cases and of draws refused or
    passed over (xdist calls this per finished worker)."""
    output = getattr(node, "workeroutput", {})
    judged = output.get("fuzzattn_judged", 0)
    node.config.stash[_JUDGED_KEY] = node.config.stash.get(_JUDGED_KEY, 0) + judged
    unjudged = node.config.stash.setdefault(_UNJUDGED_KEY, collections.Counter())
    for impl, what, summary, n in output.get("fuzzattn_unjudged", []):
        unjudged[(impl, what, summary)] += n


def pytest_terminal_summary(terminalreporter, config):
    from fuzzattn.campaigns import verdicts
    judged = config.stash.get(_JUDGED_KEY, 0) + verdicts.judged_total
    if judged:
        seconds = time.perf_counter() - config.stash.get(_START_KEY, time.perf_counter())
        terminalreporter.write_line(f"fuzzattn: {judged} cases judged in {seconds:.1f} s "
                                    f"({judged / max(seconds, 1e-9):.1f} cases/s)")
    # Draws Hypothesis replaced without a verdict (declared refusals, known upstream defects'
    # cases) and cases judged without their gradients. Never passes, so never silent: a campaign
    # that mostly drew these tested little.
    unjudged = config.stash.get(_UNJUDGED_KEY, collections.Counter()) + _unjudged_here()
    for (impl, what, summary), n in unjudged.most_common(10):
        terminalreporter.write_line(f"fuzzattn: {impl}: {n} {what}: {summary}")


def _unjudged_here() -> collections.Counter:
    """(implementation, what, summary) -> draws or cases, in this process."""
    from fuzzattn.campaigns import verdicts
    from fuzzattn.contract.known_defects import kind
    counts = collections.Counter()
    for (impl, summary), n in verdicts.refusal_counts.items():
        counts[(impl, f"draws {kind(summary)}", summary)] += n
    for (impl, summary), n in verdicts.forward_only_counts.items():
        counts[(impl, "cases judged without gradients", summary)] += n
    return counts


def pytest_unconfigure(config):
    state = config.stash.get(_STATE_KEY, None)
    if state is not None:
        state.restore()


def isolated_judge(config, impl, needed: bool):
    """The judge function a regression item replays with: a worker's when the run isolates or
    the file needs it (a recorded hang, segfault or device fault), else None (in-process)."""
    state = config.stash[_STATE_KEY]
    if state.workers is not False or needed:
        return state.worker_pool().get(impl).judge
    return None


def regressions_dir(config) -> Path:
    return (config.rootpath / config.getini(REGRESSIONS_INI)).resolve()


def _pin_worker_gpu():
    """One pytest-xdist worker per GPU: worker gwN uses GPU N mod count (`pytest -n <GPUs>`)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    import torch
    if torch.cuda.is_available() and torch.cuda.device_count() > 1:
        torch.cuda.set_device(int(worker[2:]) % torch.cuda.device_count())


def pytest_report_header(config):
    from fuzzattn import settings
    from fuzzattn.contract.profiles import active
    from fuzzattn.platform.versions import versions
    profile = active()
    seed = config.getoption("hypothesis_seed", default=None)
    seed_text = ("derandomized" if profile.derandomize else "random") if seed is None else str(seed)
    lines = [f"fuzzattn: profile={profile.name} ({profile.max_examples} cases per test, "
             f"seq <= {profile.max_seq}/{profile.max_large_seq}) hypothesis_seed={seed_text} "
             f"device={settings.device_description()}",
             f"fuzzattn: {settings.backend_description()}",
             "fuzzattn: " + " ".join(f"{k}={v}" for k, v in versions().items())]
    if settings.outside_specs():
        lines.append(f"fuzzattn: outside implementations: {', '.join(settings.outside_specs())}")
    state = config.stash.get(_STATE_KEY, None)
    if state is not None and state.workers is not False:
        lines.append(f"fuzzattn: isolated: one worker process per implementation, "
                     f"timeout {state.timeout or 60:g} s per case")
    return lines


# -- regression files as items ------------------------------------------------------------------
def pytest_collect_file(file_path: Path, parent):
    if file_path.suffix == ".json" and not file_path.name.startswith(".") \
            and file_path.parent.resolve() == regressions_dir(parent.config):
        from fuzzattn.pytest_regressions import RegressionFileNode
        config = parent.config
        return RegressionFileNode.from_parent(
            parent, path=file_path, judge_for=lambda impl, needed: isolated_judge(config, impl, needed))
    return None
