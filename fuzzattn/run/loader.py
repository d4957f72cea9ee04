"""Load an implementation that lives outside the repo: `path/to/file.py:NAME` or `module:NAME`.

NAME may be an `Implementation` (its capabilities are used as declared) or a plain callable
following the contract, which then gets the contract's base capabilities: fp32/bf16, D in
{16, 32, 64, 128}, causal top-left, any strides, no GQA, deterministic; its lse is checked when a
probe call shows it returns a pair. Every problem is one line naming the bad value.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path

import torch

from fuzzattn.contract.capabilities import Capabilities
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract import varlen
from fuzzattn.contract.implementation import Implementation
from fuzzattn.run import execute
from fuzzattn.inputs.materialize import materialize


class ImplementationLoadError(ValueError):
    """An --impl value that does not name a usable implementation."""


def is_file_target(target: str) -> bool:
    """The part before ':' names a file (path/to/file.py), not a module (package.module)."""
    return target.endswith(".py") or "/" in target or "\\" in target


def _import(target: str, spec: str):
    if is_file_target(target):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise ImplementationLoadError(f"--impl {spec!r}: file {target!r} does not exist")
        # The same name in every process (no hash() salt): a worker process and its supervisor
        # can then pickle references to the file's functions (a config rule) by name.
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
        stem = re.sub(r"\W", "_", path.stem)
        module_name = f"fuzzattn_external_{stem}_{digest}"
        if module_name in sys.modules:
            return sys.modules[module_name], str(path)
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        # Its siblings import as they do when it runs as a script or as a pytest test module
        # (a test file that declares its kernel next to the kernel's own file).
        sys.path.insert(0, str(path.parent))
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[module_name]
            raise ImplementationLoadError(
                f"--impl {spec!r}: importing {target!r} raised {type(exc).__name__}: {exc}") from None
        finally:
            sys.path.remove(str(path.parent))
        return module, str(path)
    try:
        module = importlib.import_module(target)
    except ImportError as exc:
        raise ImplementationLoadError(f"--impl {spec!r}: cannot import module {target!r}: {exc}") from None
    return module, getattr(module, "__file__", "") or ""


def load_implementation(spec: str, *, probe: bool = True) -> Implementation:
    """Resolve `FILE.py:NAME` / `module:NAME` to an Implementation."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ImplementationLoadError(f"--impl {spec!r} must look like path/to/file.py:NAME or module:NAME")
    module, source = _import(target, spec)
    if not hasattr(module, name):
        public = [n for n in vars(module) if not n.startswith("_")]
        raise ImplementationLoadError(f"--impl {spec!r}: {target!r} has no attribute {name!r} "
                                      f"(it defines: {', '.join(public[:12]) or 'nothing public'})")
    obj = getattr(module, name)
    if isinstance(obj, Implementation):
        impl = dataclasses.replace(obj, sources=obj.sources or (source,), spec=spec)
    elif callable(obj):
        impl = Implementation(name=name, fn=obj, caps=Capabilities(),
                              description=f"plain callable from {target}", sources=(source,),
                              spec=spec, declares=False)
    else:
        raise ImplementationLoadError(f"--impl {spec!r}: {name!r} is a {type(obj).__name__}, "
                                      "not callable and not an Implementation")
    return _probe(impl, spec) if probe else impl


def _check_signature(impl: Implementation, spec: str, q, k, v, case: AttentionCase) -> None:
    """A load error when the callable cannot take the contract's call at all."""
    kwargs = dict(causal=False, scale=1.0)
    if impl.caps.pass_config(case, backward=False):
        kwargs["config"] = {}
    if impl.caps.varlen:              # every call of a varlen declaration passes the packing
        kwargs.update(varlen.call_kwargs(case, q.device))
    try:
        signature = inspect.signature(impl.fn)
    except (TypeError, ValueError):       # a builtin or extension without one: the call tells
        return
    try:
        signature.bind(q, k, v, **kwargs)
    except TypeError as exc:
        raise ImplementationLoadError(
            f"--impl {spec!r}: {impl.name} cannot be called as fn(q, k, v, "
            f"{', '.join(f'{n}=...' for n in kwargs)}): {exc}") from None


def _probe(impl: Implementation, spec: str) -> Implementation:
    """Call once on a tiny declared case to catch a wrong signature or return shape early, and
    learn whether a plain callable returns lse. A probe call that raises anything else is not a
    load error: the implementation is returned with `probe_case` set, and its campaigns judge
    that case first (a saved, replayable counterexample). A plain callable whose probe raised
    is not assumed to return lse."""
    dtype = "float32" if "float32" in impl.caps.dtypes else sorted(impl.caps.dtypes)[0]
    head_dim = 16 if impl.caps.accepts_head_dim(16) else min(impl.caps.head_dims or {16})
    n = max(16, impl.caps.min_seq_len)
    n += -n % impl.caps.seq_multiple
    config = {name: choices[0] for name, choices in impl.caps.configs}
    # A varlen declaration takes packed cases only: one sequence of n rows.
    packing = dict(seqlens_q=(n,), seqlens_k=(n,)) if impl.caps.varlen else {}
    case = AttentionCase(1, 1, 1, n, n, head_dim, dtype=dtype, config=config, **packing)
    inputs = materialize(case, "cuda" if torch.cuda.is_available() else "cpu")
    _check_signature(impl, spec, *inputs.tensors(), case)
    call = execute.call(impl, *inputs.tensors(), case)
    if call.status == execute.CONTRACT:
        raise ImplementationLoadError(f"--impl {spec!r}: {call.summary.split(': ', 1)[-1]}")
    if not call.answered:
        if not impl.declares:
            impl = dataclasses.replace(impl, caps=dataclasses.replace(impl.caps, returns_lse=False))
        return dataclasses.replace(impl, probe_case=case)
    if not impl.declares:
        impl = dataclasses.replace(impl, caps=dataclasses.replace(impl.caps,
                                                                  returns_lse=call.lse is not None))
    return impl


def findable_spec(impl: Implementation) -> str:
    """What `--impl` needs to find `impl` again, from the process it runs in: its spec when it
    was loaded by one; its name when it is registered under it; else, for an Implementation a
    user declared in their own module (a test file), `path/to/file.py:NAME` after the module
    global that holds it, looked for in the calling frames' modules and then in the module of
    its callable, the path relative to the working directory when under it; else its name."""
    if impl.spec:
        return impl.spec
    if _registered_as_named(impl):
        return impl.name
    modules = []
    frame = sys._getframe(1)
    while frame is not None:
        if not any(frame.f_globals is seen for seen in modules):
            modules.append(frame.f_globals)
        frame = frame.f_back
    own = sys.modules.get(getattr(impl.fn, "__module__", None) or "")
    if own is not None:
        modules.append(vars(own))
    for module in modules:
        source = module.get("__file__") or ""
        if not source.endswith(".py") or str(module.get("__name__", "")).startswith("fuzzattn."):
            continue
        name = next((key for key, value in list(module.items()) if value is impl), None)
        if name is not None:
            path = Path(source).resolve()
            try:
                path = path.relative_to(Path.cwd())
            except ValueError:
                pass
            return f"{path}:{name}"
    return impl.name


def _registered_as_named(impl: Implementation) -> bool:
    """`impl` is the registered implementation or mutant of its name. Asked only of callables
    from fuzzattn's own kernels: loading the registry imports every registered kernel."""
    if not str(getattr(impl.fn, "__module__", "")).startswith("fuzzattn."):
        return False
    from fuzzattn.run.registry import UnknownImplementationError, get
    try:
        return get(impl.name) is impl
    except UnknownImplementationError:
        return False
