"""The worker side of isolated judging (fuzzattn.isolation.supervisor is the supervisor), and what
both sides need to agree on: how an implementation is named so another process can find it,
which fields of it travel, what a CUDA device fault looks like, and where a stack dump points.

The worker is a process forked from a fork server that never touched CUDA, or spawned
(isolation/starting.py: forking a process that holds CUDA state or threads is unsafe); it
imports fuzzattn, resolves the implementation by its *spec*, says ready, and then judges every
case it is sent with `fuzzattn.judgement.judge.judge` until told to stop. It keeps a faulthandler
log open for its whole life, so a fatal signal (and SIGUSR1, which the supervisor sends before
killing a hung worker) leaves the Python stack where the supervisor can read it.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import re
import signal
import sys
import sysconfig
from pathlib import Path

from fuzzattn.platform.device_faults import context_fault
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.implementation import Implementation


# The fields of an Implementation that travel to the worker, which resolves only the callable:
# capabilities a supervisor probed or a test replaced must be the ones the worker judges with.
FIELDS = ("name", "caps", "description", "mutant_of", "backend", "sources", "spec", "declares",
          "probe_case")


class IsolationError(RuntimeError):
    """The worker could not be started, or the harness itself (not the kernel) raised in it."""


def portable(fields: dict) -> dict:
    """The fields that can travel back by pickle: a closure in a declaration (an autotuned
    kernel's configuration rule) cannot, and the supervisor keeps its own declaration of those."""
    try:
        pickle.dumps(fields)
        return fields
    except (pickle.PicklingError, AttributeError, TypeError):
        kept = {}
        for name, value in fields.items():
            try:
                pickle.dumps(value)
                kept[name] = value
            except (pickle.PicklingError, AttributeError, TypeError):
                pass
        return kept


def declared(impl: Implementation) -> dict:
    return {f: getattr(impl, f) for f in FIELDS}


def spec_of(impl: Implementation) -> str:
    """A spec that resolves to `impl`'s callable in a fresh process: the spec it was loaded by
    (`FILE.py:NAME`), its registered name, else `FILE.py:NAME` / `module:NAME` of the module
    attribute holding it (or an Implementation wrapping it). Raises IsolationError for a callable
    no module exposes (a closure, a lambda made at run time)."""
    if impl.spec:
        return impl.spec
    from fuzzattn.run.registry import RegistryError, implementations, mutants
    try:
        registered = {**implementations(), **mutants()}.get(impl.name)
    except RegistryError:
        registered = None
    if registered is not None and registered.fn is impl.fn:
        return impl.name
    fn = impl.fn
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is not None:
        # An attribute holding the Implementation first: its name is the one a person would give.
        holders = sorted((attr for attr, value in vars(module).items()
                          if value is fn or (isinstance(value, Implementation) and value.fn is fn)),
                         key=lambda attr: not isinstance(getattr(module, attr), Implementation))
        if holders:
            path = getattr(module, "__file__", None)
            # The loader imports files under a private module name, and a script runs as
            # __main__: neither is importable by name in the worker, so name the file.
            by_file = module.__name__ == "__main__" or module.__name__.startswith("fuzzattn_external_")
            if by_file and path:
                return f"{path}:{holders[0]}"
            if not by_file:
                return f"{module.__name__}:{holders[0]}"
    raise IsolationError(f"{impl.name}: its callable is not a module attribute, so a worker process "
                         "cannot import it; give a FILE.py:NAME or module:NAME spec")


# -- the worker process ---------------------------------------------------------------------------
def worker_main(conn, spec: str, fields: bytes | None, device: str, threads: int | None,
                fault_log: str, environ: dict | None = None) -> None:
    """Resolve the implementation, say ready, then judge every case sent until told to stop."""
    import faulthandler
    import traceback
    import warnings

    if environ is not None:
        # A worker forked from the fork server inherits the server's environment, fixed when it
        # started; the supervisor's own (FUZZATTN_MEMORY_BUDGET_GB, a kernel's settings) is the
        # one a case must be judged under.
        os.environ.clear()
        os.environ.update(environ)
    from fuzzattn.platform import flight
    flight.disable()               # this worker's supervisor watches it, not the run's

    log = open(fault_log, "w")     # kept open for the process's life: faulthandler writes to its fd
    faulthandler.enable(log, all_threads=False)
    if hasattr(faulthandler, "register"):
        faulthandler.register(signal.SIGUSR1, file=log, all_threads=False)
    try:
        import torch
        from fuzzattn.judgement.judge import judge
        from fuzzattn.platform import cuda_waits
        from fuzzattn.platform import shared_gpu
        shared_gpu.guarding = False    # the supervisor applies the MPS rule to what this reports
        from fuzzattn.triton_interpreter.backend import ensure_backend
        try:
            cuda_waits.apply()         # how this worker waits for the GPU, as in the supervisor
        except cuda_waits.CudaWaitRefused:
            pass                       # the supervisor, set up the same way, has said so
        ensure_backend()               # the interpreter and its bf16 repairs, as in the supervisor
        if threads:
            torch.set_num_threads(threads)     # the supervisor's setting (the CLI pins 1 on CPU)
        # The CLI's own filters: interpreter numpy warnings are verdicts' noise, not news.
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
        warnings.filterwarnings("ignore", message="Conversion of an array with ndim > 0 to a scalar",
                                category=DeprecationWarning)
        impl = _resolve(spec, fields)
        # The first judge() in a process pays one-off costs (lazy torch imports, first
        # dispatches, a CUDA context): pay them now, on a harness-owned implementation, so they
        # count against the start-up timeout and not against the first case's.
        judge(_warm_up_impl(), AttentionCase(1, 1, 1, 2, 2, 16), device=device)
        from fuzzattn.platform.gc_tuning import freeze_long_lived
        freeze_long_lived()            # everything imported and warmed is here for good
    except BaseException as exc:       # a start-up failure is reported, not left to a timeout
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", portable(declared(impl))))
    while True:
        try:
            request, payload = conn.recv()
        except (EOFError, OSError):
            return                     # the supervisor is gone
        if request == "stop":
            return
        try:
            if request == "probe":
                from fuzzattn.run.loader import _probe
                conn.send(("declared", portable(declared(_probe(impl, spec)))))
            else:
                case, expected_sha256, gradients, margins = payload
                judged = judge(impl, AttentionCase.from_dict(case), device=device,
                               expected_sha256=expected_sha256, gradients=gradients,
                               margins=margins)
                fault = context_fault(device)
                conn.send(("judged", judged) if fault is None else ("faulted", (judged, fault)))
        except Exception as exc:       # the harness raised: the supervisor decides what it means
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            first = str(exc).splitlines()[0] if str(exc) else ""
            conn.send(("error", (f"{type(exc).__name__}: {first}",
                                 text + "\n" + traceback.format_exc())))


def _warm_up_impl() -> Implementation:
    import torch

    def attention(q, k, v, *, causal, scale):
        scores = (q @ k.transpose(-1, -2)) * scale
        if causal:
            scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
        return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores.float(), dim=-1)

    return Implementation(name="isolation-warm-up", fn=attention)


def _resolve(spec: str, fields: bytes | None) -> Implementation:
    from fuzzattn.run.loader import load_implementation
    from fuzzattn.run.registry import get
    # When the supervisor sends `fields` it already knows the declaration (probed or given):
    # probing here would run the kernel outside any timeout. A bare spec is probed on request.
    impl = load_implementation(spec, probe=False) if ":" in spec else get(spec)
    if fields is not None:         # unpickled now that the implementation's module is imported
        impl = dataclasses.replace(impl, **pickle.loads(fields))
    return impl


# -- reading a faulthandler dump ---------------------------------------------------------------------
_FRAME = re.compile(r'File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>\S+)')


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.add(str(Path(__file__).resolve().parent.parent))          # fuzzattn itself
    return tuple(sorted(str(Path(d).resolve()) + os.sep for d in dirs if d))


def where(dump: str) -> str:
    """' at FILE:LINE in FUNC' for the innermost frame of a faulthandler dump that is not in the
    standard library, site-packages or fuzzattn (the kernel's own code), else the innermost one."""
    frames = []
    for line in dump.splitlines():
        match = _FRAME.search(line)
        if match:
            frames.append(match)
        elif frames and not line.strip():
            break                       # first stack only (the most recent dump's thread)
    if not frames:
        return ""
    libs = _library_dirs()
    own = [f for f in frames if not str(Path(f["file"]).resolve()).startswith(libs)]
    f = (own or frames)[0]
    return f" at {Path(f['file']).name}:{f['line']} in {f['func']}"
