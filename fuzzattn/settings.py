"""Run settings: what a fuzzattn run sets up before it judges anything, in one place for the
command line and the pytest plugin (which uses it only in runs that opted in).

    profile         the size/budget profile, and the Hypothesis settings profile of that name
    threads         one torch thread per worker on CPU-only machines
    backend         Triton compiled or interpreted, with the interpreter's bf16 repairs
    bf16 policy     bf16 cases of Triton kernels skip when the interpreter cannot be repaired
    implementations the registered ones plus those named with --impl / --fuzzattn-impl

Hypothesis itself loads a built-in profile called "ci" when CI=true (derandomize=True,
database=None, deadline=None, print_blob=True). fuzzattn registers its own "ci" *on top of* that
one (parent=the built-in), so CI keeps Hypothesis's determinism and adds fuzzattn's budget; the
chosen profile is then loaded explicitly, so nothing depends on import order.
"""
from __future__ import annotations

import contextlib
import os

from fuzzattn.contract.implementation import Implementation
from fuzzattn.contract.profiles import PROFILES, Profile, ProfileError, active_name

# Outside implementations this run was given (--fuzzattn-impl): set by the pytest plugin in
# every process (pytest-xdist workers get the same options), read by test modules at import.
_outside_specs: list[str] = []
# Shards per differential test (--fuzzattn-shards): each (implementation, dtype) campaign splits
# into this many tests with distinct Hypothesis seeds and an equal share of the budget, so that
# pytest-xdist workers share one implementation's campaign.
_shards = 1


# -- profile ------------------------------------------------------------------------------------
def register_hypothesis_profiles() -> None:
    """Register one Hypothesis settings profile per fuzzattn profile (loading none of them)."""
    from hypothesis import HealthCheck, settings
    # Slow interpreted kernels and float64 oracles: deadlines would only flake; shapes, not
    # data volume, are what we draw, so the too_slow/data_too_large checks do not apply.
    # report_multiple_bugs off: every failure of a fuzzattn test is one Counterexample raised
    # from one line, so Hypothesis's search for a second distinct bug after the first (up to
    # twice the calls the first took) could only find the same one again; it shrinks at once.
    common = dict(deadline=None, report_multiple_bugs=False,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.filter_too_much])
    builtin_ci = settings.get_profile("ci")
    for p in PROFILES.values():
        parent = builtin_ci if p.name == "ci" else None
        kwargs = dict(common, max_examples=p.max_examples)
        if p.derandomize:
            kwargs.update(derandomize=True, database=None)
        settings.register_profile(p.name, parent=parent, **kwargs)


def load_profile(name: str | None = None) -> Profile:
    """Load profile `name` (default: the active one) for sizes and for Hypothesis; raises
    ProfileError with one line naming the bad name."""
    from hypothesis import settings
    name = name or active_name()
    if name not in PROFILES:
        raise ProfileError(f"profile {name!r} is not one of {', '.join(sorted(PROFILES))}")
    register_hypothesis_profiles()
    settings.load_profile(name)
    os.environ["FUZZATTN_PROFILE"] = name   # so strategies and xdist workers agree
    return PROFILES[name]


# -- threads ------------------------------------------------------------------------------------
def wants_one_thread() -> bool:
    """Fuzzed cases are tiny (sequences up to ~80 on the CPU), so intra-op threads buy nothing,
    and when another process holds a core they stall at their barriers (60 torch_tiled cases:
    0.45 s single-threaded, 8-13 s one run in three with two threads on two cores;
    docs/CALIBRATION.md#threads).
    OMP_NUM_THREADS, if set, wins."""
    import torch
    return not torch.cuda.is_available() and "OMP_NUM_THREADS" not in os.environ


def threads_per_process(n: int) -> int | None:
    """torch's intra-op threads for each of n judging processes on this machine (pytest-xdist
    workers, `--workers`); None when OMP_NUM_THREADS decides. Without CUDA one (wants_one_thread);
    with it, the process's share of the cores: torch's default gives every process a thread per
    core, n times as many threads as cores, whose waits at their barriers spin. 4 `--workers`
    with that default judged 4 sdpa fp32 cases/s on a GPU where one process judges 56
    (docs/CALIBRATION.md#threads)."""
    if "OMP_NUM_THREADS" in os.environ:
        return None
    if wants_one_thread():
        return 1
    return max(1, (os.cpu_count() or 1) // max(1, n))


@contextlib.contextmanager
def one_cpu_thread():
    """torch single-threaded for the duration (CPU-only machines), then as it was."""
    import torch
    before = torch.get_num_threads()
    pin = wants_one_thread()
    if pin:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if pin:
            torch.set_num_threads(before)


# -- backend ------------------------------------------------------------------------------------
class BackendError(RuntimeError):
    """Triton cannot be set up here (e.g. numpy too new for triton 3.6's interpreter)."""


def choose_backend() -> None:
    """Set up Triton (interpreter on CPU, bf16 repairs) before an outside implementation file
    can import it, and how this process waits for the GPU (fuzzattn/platform/cuda_waits.py) before anything
    runs there; a broken setup becomes one line."""
    from fuzzattn.platform import cuda_waits
    from fuzzattn.triton_interpreter.backend import ensure_backend
    try:
        cuda_waits.apply()
    except cuda_waits.CudaWaitError as exc:
        raise BackendError(str(exc)) from None
    except cuda_waits.CudaWaitRefused as exc:     # asked for, not in effect: say so, go on
        import sys
        print(f"fuzzattn: {cuda_waits.ENV}: {exc}", file=sys.stderr)
    try:
        ensure_backend()
    except Exception as exc:
        raise BackendError(f"cannot set up the Triton backend: {' '.join(str(exc).split())}") from None


def check_environment() -> None:
    """Settings read from the environment deep inside a run (FUZZATTN_PALETTE, FUZZATTN_SHAPES,
    FUZZATTN_COMPILE_AHEAD, FUZZATTN_HOST_JUDGE_MACS, FUZZATTN_HOST_CHECK_ELEMENTS, FUZZATTN_MPS), checked up front by
    the CLI and the pytest plugin: a bad value is a one-line usage error (ValueError naming it)
    before anything runs, not an internal error halfway through (FUZZATTN_MPS is read only when a
    device fault happens)."""
    from fuzzattn.campaigns.compile_ahead import ahead_mode
    from fuzzattn.campaigns.compile_palette import palette_mode
    from fuzzattn.judging.placement import host_check_elements, host_judge_macs
    from fuzzattn.platform.shared_gpu import mode as mps_mode
    from fuzzattn.strategies.shape_palette import palette_size
    from fuzzattn.contract import Capabilities
    for check in (palette_mode, ahead_mode, host_judge_macs, host_check_elements, mps_mode,
                  lambda: palette_size(Capabilities())):
        check()
    from fuzzattn.campaigns.hypothesis_internals import campaign_internals_supported
    if (unsupported := campaign_internals_supported()) is not None:
        raise ValueError(unsupported)          # a campaign would run with settings it did not mean


def backend_description() -> str:
    from fuzzattn.triton_interpreter.backend import bf16_dot_status, is_interpreted
    ok, reason = bf16_dot_status()
    return (f"triton {'interpreted' if is_interpreted() else 'compiled'}; "
            f"bf16 tl.dot {'ok' if ok else 'BROKEN'} ({reason})")


def device_description() -> str:
    import torch
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def bf16_unavailable(impl: Implementation) -> str | None:
    """Why bf16 cannot be judged for this implementation here (a broken interpreter dot), or None."""
    if impl.backend != "triton":
        return None
    from fuzzattn.triton_interpreter.backend import bf16_dot_status
    ok, reason = bf16_dot_status()
    return None if ok else reason


# -- implementations ----------------------------------------------------------------------------
def shards() -> int:
    return _shards


def set_shards(n: int) -> int:
    """Set the run's shard count; returns the previous one (to restore it)."""
    global _shards
    previous, _shards = _shards, n
    return previous


def outside_specs() -> list[str]:
    """The outside implementation specs this run was given."""
    return list(_outside_specs)


def set_outside_specs(specs: list[str]) -> list[str]:
    """Replace the run's outside specs; returns the previous ones (to restore them)."""
    global _outside_specs
    previous, _outside_specs = _outside_specs, list(specs)
    return previous


def outside_implementations() -> list[Implementation]:
    """The implementations named by the run's outside specs, each loaded once per process."""
    return [load_outside(spec) for spec in outside_specs()]


def implementations() -> list[Implementation]:
    """Every registered implementation, then the run's outside ones."""
    from fuzzattn.run.registry import implementations as registered
    return list(registered().values()) + outside_implementations()


_LOADED: dict[str, Implementation] = {}


def load_outside(spec: str, *, isolated: bool = False, timeout: float | None = None) -> Implementation:
    """Load an outside implementation once per process; `isolated` runs its probe call in a
    worker process (engine.isolation.load_isolated), so one that hangs or dies there is loaded
    anyway and its failure left to the isolated tests to find."""
    if spec not in _LOADED:
        if isolated:
            from fuzzattn.isolation.pool import DEFAULT_TIMEOUT, load_isolated
            _LOADED[spec] = load_isolated(spec, timeout=timeout or DEFAULT_TIMEOUT)
        else:
            from fuzzattn.run.loader import load_implementation
            _LOADED[spec] = load_implementation(spec)
    return _LOADED[spec]
