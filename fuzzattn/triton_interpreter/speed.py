"""Costs of Triton's CPU interpreter removed without changing a result.

Each edit wraps or replaces one private function of triton 3.6's interpreter or language
frontend (what each removes is in its docstring; semantic.py holds those of TritonSemantic).
Every edit keeps triton's own function (`__wrapped__`, which the tests compare against) and hands
it anything not recognised: other builders, other types, errors (triton raises its own). If
Triton's internals are not where expected an edit changes nothing. `install()` applies them only
on a triton inside fence.TESTED; FUZZATTN_INTERPRETER_SPEED=0 installs none (triton as shipped,
the baseline the tests compare bits against); FUZZATTN_SANITIZE_OVERFLOW=1 keeps the sanitizer.
"""
from __future__ import annotations

import dataclasses
import os

from fuzzattn.triton_interpreter import semantic
from fuzzattn.triton_interpreter.fence import MARK as _MARK
from fuzzattn.triton_interpreter.fence import tested

_patched_in_launch: set | None = None      # module ids patched by the launch now running


def install() -> None:
    """Idempotent; call only under the interpreter, before kernels run. Nothing on a triton
    outside fence.TESTED."""
    if os.environ.get("FUZZATTN_INTERPRETER_SPEED", "1") in ("0", "false", "no") or not tested():
        return                                  # triton's interpreter as shipped
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return
    if os.environ.get("FUZZATTN_SANITIZE_OVERFLOW", "0") not in ("1", "true", "yes"):
        _sanitizer_off(interp)
    _patch_once_per_launch(interp)
    _lazy_tuple_type_names()
    _np_dtype_table_once(interp)
    _plain_block_types()
    _shared_tensor_shapes()
    _lean_builtin_calls(interp)
    _plain_values_unwrapped_first()
    semantic.install(interp)


def _sanitizer_off(interp) -> None:
    """The interpreter recomputes every int32 `+`, `-`, `*` in int64 and range-checks it with a
    device assert. Compiled Triton does so only with debug=True, and fuzzattn's tensors (capped by
    its memory budget) are far from 2**31, so the check is turned off."""
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
    """Every call of a @triton.jit helper re-patches triton.language (`inspect.getmembers` over
    tl, tl.core, tl.math, tl.tensor) although the kernel's launch patched the same modules. Inside
    a launch a helper whose language modules are already patched skips the repeat."""
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
    """tuple_type formats its name in __init__ for every block shape; only printing and error
    messages read it, so it is formatted when first read."""
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

    setattr(__init__, _MARK, True)
    tuple_type.__init__ = __init__
    # the string triton 3.6 builds in __init__
    _name_when_read(tuple_type, lambda t: "[" + ",".join(f"{k}:{v}" for k, v in zip(t.fields, t.types)) + "]")


def _name_when_read(cls, build) -> None:
    """`cls.name`, which triton formats in every __init__ though only printing and error
    messages read it, as a property that builds it with `build(self)` on first read (and still
    takes an assignment, as triton's own code may make one)."""
    def name(self):
        cached = self.__dict__.get("_name")
        if cached is None:
            cached = self.__dict__["_name"] = build(self)
        return cached

    def set_name(self, value):
        self.__dict__["_name"] = value

    cls.name = property(name, set_name)


def _plain_block_types() -> None:
    """block_type(element_ty, shape) with a shape of ints (plain, or each in one constexpr: what
    the interpreter passes) skips the unwrapping, checks a shape it has seen once, reuses its tuple
    type, and formats its name when read. Its shape is a fresh `tl.tuple` of the same ints, as
    triton's own __init__ builds (in triton.language.core `tuple` is tl.tuple, not Python's).
    Anything else takes triton's own path."""
    from triton.language import core
    block_type, tl_tuple = getattr(core, "block_type", None), getattr(core, "tuple", None)
    original = getattr(block_type, "__init__", None)
    tuple_type_of = getattr(core, "_type_for_tuple_values", None)
    validate = getattr(core, "validate_block_shape", None)
    if None in (original, tl_tuple, tuple_type_of, validate) or getattr(original, _MARK, False) \
            or isinstance(getattr(block_type, "name", None), property):
        return
    known: dict = {}        # shape (Python tuple of ints) -> (numel, its tuple_type)

    constexpr = core.constexpr

    def plain(d):
        """d as a plain int (unwrapping one constexpr), or None."""
        if type(d) is constexpr:
            d = d.value
        return d if type(d) is int else None

    def __init__(self, element_ty, shape):
        dims = shape.values if isinstance(shape, tl_tuple) else shape
        key = tuple(plain(d) for d in dims) if isinstance(dims, (list, tuple)) else ()
        if not key or None in key:
            original(self, element_ty, shape)       # anything else, and errors: triton's way
            return                                  # (its name lands in the property's setter)
        self.element_ty = element_ty
        found = known.get(key)
        if found is None:
            found = known[key] = (validate(list(key)), tuple_type_of(list(key)))
        self.shape = tl_tuple(key, found[1])
        self.numel = found[0]

    setattr(__init__, _MARK, True)
    block_type.__init__ = __init__
    _name_when_read(block_type, lambda t: f"<{t.shape}, {t.element_ty}>")   # triton 3.6's string


def _shared_tensor_shapes() -> None:
    """tl.tensor.__init__ rebuilds its shape as a tl.tuple of new constexpr objects (with its
    tuple type) and its numel for every value the interpreter makes. The constexprs, tuple type
    and numel a shape determines are built once (constexprs are never mutated); each tensor still
    gets its own tl.tuple. Most values are never asked for their shape (semantic reads `.type`),
    so `shape` and `numel` are properties built from the type on first read, then kept;
    assigning them still works. Nothing in triton reassigns a tensor's `type`."""
    from triton.language import core
    tensor, constexpr = getattr(core, "tensor", None), getattr(core, "constexpr", None)
    tl_tuple, tuple_type_of = getattr(core, "tuple", None), getattr(core, "_type_for_tuple_values", None)
    original = getattr(tensor, "__init__", None)
    if None in (original, constexpr, tl_tuple, tuple_type_of) or getattr(original, _MARK, False) \
            or isinstance(getattr(tensor, "shape", None), property):
        return
    import math
    shapes: dict = {}

    def shared(ty):
        """(constexpr dims, their tuple type, numel constexpr) of a type, built once per dims."""
        dims = tuple(ty.shape) if ty.is_block() else ()
        found = shapes.get(dims)
        if found is None:
            values = [constexpr(d) for d in dims]
            found = shapes[dims] = (values, tuple_type_of(values), constexpr(math.prod(dims)))
        return found

    def __init__(self, handle, type):
        self.handle = handle
        self.type = type
        self.dtype = type.scalar

    def shape(self):
        found = self.__dict__.get("_shape")
        if found is None:
            values, tuple_type, _ = shared(self.type)
            found = self.__dict__["_shape"] = tl_tuple(values, tuple_type)
        return found

    def numel(self):
        found = self.__dict__.get("_numel")
        if found is None:
            found = self.__dict__["_numel"] = shared(self.type)[2]
        return found

    def kept(name):
        return lambda self, value: self.__dict__.__setitem__(name, value)

    setattr(__init__, _MARK, True)
    tensor.__init__ = __init__
    tensor.shape = property(shape, kept("_shape"))
    tensor.numel = property(numel, kept("_numel"))


def _np_dtype_table_once(interp) -> None:
    """`_get_np_dtype` rebuilt its dtype table on every call; triton's answer is kept per type."""
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


def _lean_builtin_calls(interp) -> None:
    """Every tl builtin the interpreter patches ran through a lambda that copied its keyword
    arguments without `_semantic` into a new dict, then through @builtin's wrapper, which only
    checks that `_semantic` was given. The patched function sets `_semantic` in the keyword dict
    Python built for the call and, for a plain @builtin wrapper, calls the function it wraps (the
    check always passes: `_semantic` is set). Same function, arguments and semantic object per
    member as triton's."""
    from triton.language import core
    original = getattr(interp, "_patch_attr", None)
    semantic_cls = getattr(interp, "TritonSemantic", None)
    builtin = getattr(core, "builtin", None)
    if None in (original, semantic_cls, builtin) or getattr(original, _MARK, False):
        return
    builtin_wrapper_code = builtin(lambda: None).__code__    # every @builtin wrapper's code

    def _patch_attr(obj, name, member, builder, scope):
        semantic = semantic_cls(builder)
        target = member
        if getattr(member, "__code__", None) is builtin_wrapper_code and hasattr(member, "__wrapped__"):
            target = member.__wrapped__

        def patched(*args, **kwargs):
            kwargs["_semantic"] = semantic
            return target(*args, **kwargs)

        scope.set_attr(obj, name, patched)

    setattr(_patch_attr, _MARK, True)
    _patch_attr.__wrapped__ = original      # triton's own, for tests and debugging
    interp._patch_attr = _patch_attr


def _plain_values_unwrapped_first() -> None:
    """triton.language.core._unwrap_if_constexpr (every builtin unwraps its flags and axes,
    every dtype `==` its operand) tests a value against list, tuple, tl.tuple and constexpr in
    turn. A value whose class is exactly constexpr gives its
    value and one whose class is exactly a tensor, a dtype, None, bool, int, float or str comes
    back as it is, as triton's tests end for them (none is a list, a tuple or a constexpr);
    anything else, subclasses included, goes to triton's own. core's functions look the name up
    in core's globals, so replacing it there reaches them."""
    from triton.language import core
    original = getattr(core, "_unwrap_if_constexpr", None)
    constexpr = getattr(core, "constexpr", None)
    if None in (original, constexpr) or getattr(original, _MARK, False):
        return
    as_is = {core.tensor, core.dtype, core.pointer_type, core.block_type, type(None), bool, int,
             float, str}

    def _unwrap_if_constexpr(o):
        cls = type(o)
        if cls is constexpr:
            return o.value
        if cls in as_is:
            return o
        return original(o)

    setattr(_unwrap_if_constexpr, _MARK, True)
    _unwrap_if_constexpr.__wrapped__ = original      # triton's own, for tests and debugging
    core._unwrap_if_constexpr = _unwrap_if_constexpr
