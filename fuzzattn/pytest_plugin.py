"""The fuzzattn pytest plugin: replays regression fixtures as test items and reports the setup.

Registered through the `pytest11` entry point. Every `*.json` under a `regressions/` folder
becomes one item per implementation that supports its case (`regressions/<key>.json::sdpa`), so a
bug found once is checked against every implementation forever after. A malformed fixture becomes
one failing item with a one-line message naming the field; the other fixtures still run.
Heavy imports (torch, kernels) happen inside hooks, so loading the plugin stays cheap.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest


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


def pytest_configure(config):
    from . import profiles
    name = config.getoption("fuzzattn_profile") or os.environ.get("FUZZATTN_PROFILE")
    hyp = config.getoption("hypothesis_profile", default=None)
    if name is None and hyp in profiles.PROFILES:
        name = hyp
    profiles.load(name)
    from hypothesis import settings
    if hyp is not None and hyp != profiles.active_name():
        settings.load_profile(hyp)      # an explicit --hypothesis-profile wins for settings
    budget = config.getoption("fuzzattn_max_examples")
    if budget is not None:
        if budget < 1:
            raise pytest.UsageError(f"--fuzzattn-max-examples={budget} must be at least 1")
        settings.register_profile("fuzzattn-budget", parent=settings(), max_examples=budget)
        settings.load_profile("fuzzattn-budget")
    # Fixtures go to <rootdir>/regressions wherever pytest was started from; xdist workers inherit.
    os.environ.setdefault("FUZZATTN_FIXTURES_DIR", str(config.rootpath / "regressions"))
    _pin_worker_gpu()
    _one_thread_per_cpu_worker()
    specs = config.getoption("fuzzattn_impl")
    if specs:
        from .loader import ImplementationLoadError, load_implementation
        for spec in specs:          # a bad spec is a one-line usage error, before any test runs
            try:
                load_implementation(spec)
            except ImplementationLoadError as exc:
                raise pytest.UsageError(str(exc)) from None
        os.environ["FUZZATTN_IMPL"] = json.dumps(specs)   # xdist workers inherit it


def _pin_worker_gpu():
    """One pytest-xdist worker per GPU: worker gwN uses GPU N mod count (`pytest -n <GPUs>`)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    import torch
    if torch.cuda.is_available() and torch.cuda.device_count() > 1:
        torch.cuda.set_device(int(worker[2:]) % torch.cuda.device_count())


def _one_thread_per_cpu_worker():
    """Without a GPU, `pytest -n auto` already runs one worker per core; torch's own intra-op
    threads on top of that oversubscribe the cores (measured: 60 torch_tiled cases took 8-13 s
    one run in three with 2 threads, 0.45 s every time with 1). OMP_NUM_THREADS, if set, wins."""
    import torch
    if os.environ.get("PYTEST_XDIST_WORKER") and not torch.cuda.is_available() \
            and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


def pytest_report_header(config):
    import torch
    from . import profiles
    from .fixtures import versions
    profile = profiles.active()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    lines = [f"fuzzattn: profile={profile.name} ({profile.max_examples} cases per test, "
             f"seq <= {profile.max_seq}/{profile.max_large_seq}) device={device}",
             "fuzzattn: " + " ".join(f"{k}={v}" for k, v in versions().items())]
    from .interpreter import bf16_dot_status, is_interpreted
    ok, reason = bf16_dot_status()
    lines.append(f"fuzzattn: triton {'interpreted' if is_interpreted() else 'compiled'}; "
                 f"bf16 tl.dot {'ok' if ok else 'BROKEN'} ({reason})")
    external = json.loads(os.environ.get("FUZZATTN_IMPL") or "[]")
    if external:
        lines.append(f"fuzzattn: external implementations: {', '.join(external)}")
    return lines


def extra_implementations():
    """Implementations named with --fuzzattn-impl (shared with xdist workers via the env)."""
    return [_load_once(spec) for spec in json.loads(os.environ.get("FUZZATTN_IMPL") or "[]")]


@functools.lru_cache(maxsize=None)
def _load_once(spec: str):
    from .loader import load_implementation
    return load_implementation(spec)


def all_implementations():
    from .registry import implementations
    return list(implementations().values()) + extra_implementations()


# -- fixture replay -------------------------------------------------------------------------------
def pytest_collect_file(file_path: Path, parent):
    if file_path.suffix == ".json" and file_path.parent.name == "regressions" \
            and not file_path.name.startswith("."):
        return FixtureFile.from_parent(parent, path=file_path)
    return None


class FixtureFile(pytest.File):
    def collect(self):
        from .fixtures import FixtureError, load
        try:
            fixture = load(self.path)
        except FixtureError as exc:
            yield BrokenFixtureItem.from_parent(self, name="malformed", message=str(exc))
            return
        impls = [impl for impl in all_implementations() if impl.supports(fixture.case)]
        if not impls:
            yield BrokenFixtureItem.from_parent(
                self, name="unsupported", skip=True,
                message=f"no registered implementation declares {fixture.case}")
        for impl in impls:
            yield FixtureItem.from_parent(self, name=impl.name, fixture=fixture, impl=impl)


class FixtureFailure(AssertionError):
    pass


class FixtureItem(pytest.Item):
    def __init__(self, *, fixture, impl, **kwargs):
        super().__init__(**kwargs)
        self.fixture = fixture
        self.impl = impl

    def runtest(self):
        from .replay import replay_one
        result = replay_one(self.fixture, self.impl)
        if result.skipped:
            pytest.skip(result.message)
        if not result.passed:
            raise FixtureFailure(result.message)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, FixtureFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"replay {self.path.name} on {self.impl.name}"


class BrokenFixtureItem(pytest.Item):
    def __init__(self, *, message, skip=False, **kwargs):
        super().__init__(**kwargs)
        self.message = message
        self.skip = skip

    def runtest(self):
        if self.skip:
            pytest.skip(self.message)
        raise FixtureFailure(self.message)

    def repr_failure(self, excinfo):
        return str(excinfo.value)

    def reportinfo(self):
        return self.path, None, f"fixture {self.path.name}"
