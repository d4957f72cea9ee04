"""Two costs of Triton's CPU interpreter that change no result, removed.

Measured with cProfile on 30 ci-profile cases of triton_fa2 (fp32, two interpreted forwards per
case; `python benchmarks/throughput.py` reproduces the rates): 55 s in all, of which

* 21 s were the interpreter's integer-overflow sanitizer. Every `+`, `-`, `*` on int32 tensors
  (pointer offsets, masks) is recomputed in int64 and range-checked with a device assert. Compiled
  Triton emits these asserts only with debug=True, so a compiled kernel is never checked this
  way; and under the interpreter fuzzattn's tensors are small (the memory budget caps a case at a
  few million elements), far from 2**31. Off by default; FUZZATTN_SANITIZE_OVERFLOW=1 keeps it.
* 11 s were re-patching triton.language on every call of a @triton.jit helper (the interpreter
  runs `inspect.getmembers` over tl, tl.core, tl.math and tl.tensor per call, for a kernel whose
  launch patched the same modules already). Inside a launch, a helper whose language modules the
  launch patched skips the repeat; any other helper is patched as before.

* `_get_np_dtype` (~58,000 calls per 30 cases) rebuilds its 18-entry dtype table on every call;
  the same table is built once.
* The interpreter builds a `tl.tuple` for every block shape it touches (~7,000 per interpreted
  forward), and each one formats its type's name string on construction, which only printing
  and error messages read. The name is computed when first read instead.

These edits are wrappers around triton 3.6's interpreter and language internals; if those are
not where this module expects them it changes nothing (the interpreter is then merely slower).
"""
from __future__ import annotations

import dataclasses
import os

_MARK = "_fuzzattn_speed"
_patched_in_launch: set | None = None      # module ids patched by the launch now running


def install() -> None:
    """Idempotent; call only under the interpreter, before kernels run."""
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return
    if os.environ.get("FUZZATTN_SANITIZE_OVERFLOW", "0") not in ("1", "true", "yes"):
        _sanitizer_off(interp)
    _patch_once_per_launch(interp)
    _lazy_tuple_type_names()
    _np_dtype_table_once(interp)


def _sanitizer_off(interp) -> None:
    builder = getattr(interp, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is not None and dataclasses.is_dataclass(options) and \
            getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _languages(fn) -> set[int]:
    """ids of the triton.language modules `_patch_lang(fn)` patches (what fn's globals see)."""
    import triton.language as tl
    return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}


def _patch_once_per_launch(interp) -> None:
    original_patch = getattr(interp, "_patch_lang", None)
    executor = getattr(interp, "GridExecutor", None)
    scope_cls = getattr(interp, "_LangPatchScope", None)
    if original_patch is None or executor is None or scope_cls is None:
        return
    if getattr(original_patch, _MARK, False):
        return
    original_call = executor.__call__

    def _patch_lang(fn):
        langs = _languages(fn)
        if _patched_in_launch is not None and langs and langs <= _patched_in_launch:
            return scope_cls()                    # nothing to undo: nothing was changed
        scope = original_patch(fn)
        if _patched_in_launch is not None:
            _patched_in_launch.update(langs)
        return scope

    def launch(self, *args, **kwargs):
        global _patched_in_launch
        outer = _patched_in_launch
        _patched_in_launch = set()
        try:
            return original_call(self, *args, **kwargs)
        finally:
            _patched_in_launch = outer

    setattr(_patch_lang, _MARK, True)
    interp._patch_lang = _patch_lang
    executor.__call__ = launch


def _lazy_tuple_type_names() -> None:
    try:
        from triton.language import core
    except ImportError:
        return
    tuple_type = getattr(core, "tuple_type", None)
    original = getattr(tuple_type, "__init__", None)
    if original is None or getattr(original, _MARK, False) or isinstance(
            getattr(tuple_type, "name", None), property):
        return

    def __init__(self, types, fields=None):
        self.types = types
        self.fields = fields or [""] * len(types)

    def name(self):
        cached = self.__dict__.get("_name")
        if cached is None:      # the string triton 3.6 builds in __init__
            cached = "[" + ",".join(f"{k}:{v}" for k, v in zip(self.fields, self.types)) + "]"
            self.__dict__["_name"] = cached
        return cached

    def set_name(self, value):
        self.__dict__["_name"] = value

    setattr(__init__, _MARK, True)
    tuple_type.__init__ = __init__
    tuple_type.name = property(name, set_name)


def _np_dtype_table_once(interp) -> None:
    original = getattr(interp, "_get_np_dtype", None)
    if original is None or getattr(original, _MARK, False):
        return
    import numpy as np
    import triton.language as tl
    table: dict = {}

    def _get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, tl.pointer_type):
            return np.dtype(np.uint64)
        found = table.get(tt_dtype)
        if found is None:
            found = table[tt_dtype] = original(tt_dtype)    # triton's own answer, then kept
        return found

    setattr(_get_np_dtype, _MARK, True)
    interp._get_np_dtype = _get_np_dtype
