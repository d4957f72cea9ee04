"""fuzzattn/engine/interpreter_speed.py: the interpreter's costs removed without changing a result."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import fuzzattn  # noqa: F401  (selects the interpreter before triton loads)
from fuzzattn.engine.triton_backend import is_interpreted

pytestmark = pytest.mark.skipif(not is_interpreted(), reason="compiled: nothing is patched")


def test_the_overflow_sanitizer_is_off_unless_asked_for():
    from triton.runtime import interpreter
    assert interpreter.interpreter_builder.options.sanitize_overflow is False
    code = ("import fuzzattn; from triton.runtime import interpreter as i; "
            "print(i.interpreter_builder.options.sanitize_overflow)")
    env = dict(os.environ, FUZZATTN_SANITIZE_OVERFLOW="1", TRITON_INTERPRET="1")
    kept = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert kept.stdout.strip() == "True", kept.stderr


def test_np_dtypes_are_triton_own_answers():
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter
    lookup = interpreter._get_np_dtype
    original = lookup.__closure__ and [c.cell_contents for c in lookup.__closure__
                                       if callable(c.cell_contents)][0]
    for ty in (tl.int1, tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.int32, tl.uint64):
        assert lookup(ty) == original(ty)
        assert lookup(tl.block_type(ty, [16])) == original(ty)
    assert lookup(tl.pointer_type(tl.float32)) == np.dtype(np.uint64)
    assert lookup(tl.block_type(tl.pointer_type(tl.float16), [4])) == np.dtype(np.uint64)


def test_tuple_type_names_are_built_when_read():
    import triton.language as tl
    from triton.language import core
    t = core.tuple_type([tl.int32, tl.float32], ["a", "b"])
    assert "_name" not in t.__dict__
    assert t.name == str(t) == "[a:int32,b:fp32]" and "_name" in t.__dict__
    assert t == core.tuple_type([tl.int32, tl.float32], ["a", "b"])


def test_block_types_of_plain_int_shapes_are_triton_own():
    """The fast block_type path gives what triton's __init__ gives: a tl.tuple shape (in
    triton.language.core, `tuple` is triton's own class), the numel, the name when read; and
    triton's own checks for shapes it cannot take."""
    import triton.language as tl
    from triton.language import core
    t = core.block_type(tl.float32, [16, 32])
    assert isinstance(t.shape, core.tuple) and list(t.shape) == [16, 32] and t.numel == 512
    assert "_name" not in t.__dict__ and t.name == "<['16', '32'], fp32>" == str(t)
    assert t == core.block_type(tl.float32, [tl.constexpr(16), tl.constexpr(32)])
    assert t == core.block_type(tl.float32, core.tuple([16, tl.constexpr(32)]))
    assert t != core.block_type(tl.float16, [16, 32]) and t.scalar is tl.float32
    with pytest.raises(ValueError, match="power of 2"):
        core.block_type(tl.float32, [16, 24])
    with pytest.raises(TypeError, match="0d block_type"):
        core.block_type(tl.float32, [])


def test_tensors_get_their_own_tl_tuple_shape_and_numel():
    import triton.language as tl
    from triton.language import core
    ty = core.block_type(tl.float32, [4, 8])
    a, b = core.tensor(None, ty), core.tensor(None, ty)
    assert isinstance(a.shape, core.tuple) and [d.value for d in a.shape] == [4, 8]
    assert a.shape is not b.shape and a.numel.value == 32 and a.dtype is tl.float32
    scalar = core.tensor(None, tl.int32)
    assert len(scalar.shape) == 0 and scalar.numel.value == 1


if is_interpreted():
    import triton
    import triton.language as tl

    @triton.jit
    def _twice(x):
        return x + x

    @triton.jit
    def _kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs)
        tl.store(out_ptr + offs, _twice(tl.maximum(x, 0.0)) * 3)


def test_a_kernel_calling_helpers_gives_the_same_bits_as_before():
    """One language patch per launch: a kernel whose @jit helper runs inside the launch matches
    torch bit for bit on an integer-exact problem (the helper's tl calls were patched)."""
    x = torch.arange(-8, 8, dtype=torch.float32)
    out = torch.empty_like(x)
    _kernel[(1,)](x, out, BLOCK=16)
    assert torch.equal(out, x.clamp_min(0) * 6)
