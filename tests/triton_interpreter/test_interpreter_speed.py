"""fuzzattn/triton_interpreter/speed.py: the interpreter's costs removed without changing a result."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fuzzattn  # noqa: F401  (selects the interpreter before triton loads)
from fuzzattn.triton_interpreter import fence
from fuzzattn.triton_interpreter.backend import ensure_backend, is_interpreted

pytestmark = pytest.mark.skipif(not is_interpreted() or not fence.tested(),
                                reason="compiled, or a triton outside fence.TESTED: nothing is patched")


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
    ensure_backend()        # the edits, as kernels/ installs them before any kernel is decorated
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


def _same_value(a, b):
    """Two tl.tensors of the interpreter: equal types, identical numpy data (dtype and bits)."""
    import numpy as np
    x, y = a.handle.data, b.handle.data
    return (a.type == b.type and a.handle.dtype == b.handle.dtype and x.dtype == y.dtype
            and x.shape == y.shape and x.strides == y.strides
            and np.array_equal(np.ascontiguousarray(x).view(np.uint8),
                               np.ascontiguousarray(y).view(np.uint8)))


def _outcome(fn, *args):
    """fn(*args) as ('ok', result) or ('raised', exception type, message)."""
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - the comparison is the point
        return ("raised", type(exc), str(exc))


def _values():
    """Scalars and blocks of several types and shapes, as the interpreter makes them."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter
    sem = interpreter.interpreter_semantic

    def block(ty, shape, fill=3):
        data = np.full(shape, fill, dtype=interpreter._get_np_dtype(ty))
        return tl.tensor(interpreter.TensorHandle(data, ty), tl.block_type(ty, list(shape)))

    ptr = tl.pointer_type(tl.float16)
    out = [sem.to_tensor(2), sem.to_tensor(-1.5), sem.to_tensor(2**33)]
    for ty in (tl.int32, tl.uint32, tl.int64, tl.float16, tl.bfloat16, tl.float32, tl.int1):
        out += [block(ty, (16,)), block(ty, (4, 1)), block(ty, (1, 16)), block(ty, (4, 16))]
    out += [block(ptr, (4, 16), 64), block(ptr, (16,), 64),
            tl.tensor(interpreter.TensorHandle(np.array([64], dtype=np.uint64), ptr), ptr)]
    return sem, out


def test_broadcasts_by_shape_are_triton_own():
    """Every pair of scalars and blocks: the same values (types, data, dtypes) or the same error
    as triton's broadcast_impl_value, and operands that need nothing come back as they were."""
    sem, values = _values()
    fast = type(sem).broadcast_impl_value
    assert getattr(fast, "_fuzzattn_speed", False)
    for a in values:
        for b in values:
            mine, theirs = _outcome(fast, sem, a, b), _outcome(fast.__wrapped__, sem, a, b)
            assert mine[0] == theirs[0] and (mine[1:] == theirs[1:] if mine[0] == "raised" else True)
            if mine[0] == "ok":
                for x, y, given in zip(mine[1], theirs[1], (a, b)):
                    assert _same_value(x, y) and ((x is given) == (y is given))


def test_binary_type_decisions_are_triton_own():
    """Every pair of operands (Python numbers among them: negative, out of int32 range) under
    every flag combination: the same values or the same error as triton's own checks."""
    import itertools
    import triton.language as tl
    sem, values = _values()
    values += [3, -2, 0.5, 2**40, True]
    fast = type(sem).binary_op_type_checking_impl
    assert getattr(fast, "_fuzzattn_speed", False)
    for _ in range(2):                                         # the second round: kept decisions
        for a, b in itertools.product(values, repeat=2):
            if not isinstance(a, tl.tensor) and not isinstance(b, tl.tensor):
                continue
            for flags in itertools.product((False, True), repeat=4):
                mine = _outcome(fast, sem, a, b, *flags)
                theirs = _outcome(fast.__wrapped__, sem, a, b, *flags)
                assert mine[0] == theirs[0], (a, b, flags, mine, theirs)
                if mine[0] == "raised":
                    assert mine[1:] == theirs[1:]
                else:
                    assert all(_same_value(x, y) for x, y in zip(mine[1], theirs[1])), (a, b, flags)


def test_expand_dims_by_shape_is_triton_own():
    sem, values = _values()
    fast = type(sem).expand_dims
    assert getattr(fast, "_fuzzattn_speed", False)
    for value in values:
        for axis in range(-1, len(value.shape) + 1):
            mine, theirs = _outcome(fast, sem, value, axis), _outcome(fast.__wrapped__, sem, value, axis)
            assert mine[0] == theirs[0]
            assert mine[1:] == theirs[1:] if mine[0] == "raised" else _same_value(mine[1], theirs[1])


def test_patched_builtins_call_the_function_with_the_interpreter_semantic():
    """A patched @builtin member calls the function @builtin wraps with the caller's arguments
    and its own `_semantic` (a `_semantic` the caller passed is replaced, as triton does);
    any other member is called as it is."""
    from types import SimpleNamespace
    from triton.language import core
    from triton.runtime import interpreter
    patch = interpreter._patch_attr
    assert getattr(patch, "_fuzzattn_speed", False)
    seen = []

    @core.builtin
    def member(x, y=0, _semantic=None):
        seen.append((x, y, _semantic))
        return x + y

    def plain(*args, **kwargs):
        seen.append((args, kwargs))
        return "plain"

    holder, scope = SimpleNamespace(member=member, plain=plain), interpreter._LangPatchScope()
    patch(holder, "member", member, interpreter.interpreter_builder, scope)
    patch(holder, "plain", plain, interpreter.interpreter_builder, scope)
    assert holder.member(1, y=2, _semantic="caller's") == 3
    x, y, semantic = seen[-1]
    assert (x, y) == (1, 2) and isinstance(semantic, interpreter.TritonSemantic)
    assert semantic.builder is interpreter.interpreter_builder
    assert holder.plain(5) == "plain" and seen[-1][0] == (5,)
    assert list(seen[-1][1]) == ["_semantic"]
    assert isinstance(seen[-1][1]["_semantic"], interpreter.TritonSemantic)
    scope.restore()
    assert holder.member is member and holder.plain is plain


_FORWARDS = """
import sys, torch
import fuzzattn
from fuzzattn import AttentionCase as C
from fuzzattn.inputs.materialize import materialize
from fuzzattn.kernels.triton_fa2 import triton_fa2_forward
cases = [C(1, 2, 2, 37, 45, 64, dtype=d, causal=c, layout=l)
         for d, c, l in (("float32", "bottom_right", ("contiguous",) * 3),
                         ("bfloat16", "top_left", ("transposed", "sliced", "last_dim_strided")),
                         ("float16", "none", ("last_dim_strided", "broadcast_heads", "broadcast_batch")))]
cases.append(C(1, 4, 1, 17, 70, 24, dtype="float16", causal="bottom_right"))
outs = []
for case in cases:
    q, k, v = materialize(case).tensors()
    outs.append(triton_fa2_forward(q, k, v, causal=case.causal if case.causal != "none" else False,
                                   scale=case.softmax_scale))
torch.save(outs, sys.argv[1])
"""


def test_triton_fa2_gives_the_same_bits_with_the_speedups_off(tmp_path):
    """triton_fa2 forwards (fp32, bf16, fp16; causal both ways and not; ragged lengths; GQA;
    transposed, sliced, strided and broadcast inputs): out and lse identical to the last bit
    with every edit of this module (a fresh process, patched) and with none of them (another,
    FUZZATTN_INTERPRETER_SPEED=0: triton's interpreter as shipped)."""
    root = str(Path(__file__).resolve().parents[2])
    results = {}
    for speed in ("1", "0"):
        env = dict(os.environ, TRITON_INTERPRET="1", FUZZATTN_INTERPRETER_SPEED=speed)
        path = tmp_path / f"speed{speed}.pt"
        done = subprocess.run([sys.executable, "-c", _FORWARDS, str(path)], env=env, cwd=root,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        results[speed] = torch.load(path)
    for (out, lse), (out0, lse0) in zip(results["1"], results["0"]):
        assert torch.equal(out.view(torch.uint8), out0.view(torch.uint8))
        assert torch.equal(lse.view(torch.uint8), lse0.view(torch.uint8))


def test_unwrapping_plain_values_first_is_triton_own():
    """core._unwrap_if_constexpr: the same object (or equal unwrapped contents) as triton's for
    constexprs, tensors, dtypes, Python scalars, lists, tuples and tl.tuples of them."""
    import triton.language as tl
    from triton.language import core
    fast = core._unwrap_if_constexpr
    assert getattr(fast, "_fuzzattn_speed", False)
    t = core.tensor(None, tl.int32)
    values = [tl.constexpr(3), tl.constexpr(None), tl.constexpr(tl.float16), t, tl.float32,
              tl.pointer_type(tl.int8), core.block_type(tl.float32, [4]), None, True, 7, 0.5, "s",
              [tl.constexpr(1), 2], (tl.constexpr(1), t), core.tuple([tl.constexpr(4), 5])]
    for value in values:
        mine, theirs = fast(value), fast.__wrapped__(value)
        assert type(mine) is type(theirs)
        if isinstance(mine, (list, tuple, core.tuple)):
            assert list(mine) == list(theirs)
        else:
            assert mine is theirs


def test_tensors_kept_first_is_triton_own():
    """to_tensor returns a tensor itself, and converts everything else as triton does."""
    import triton.language as tl
    from triton.runtime import interpreter
    sem, values = _values()
    fast = type(sem).to_tensor
    assert getattr(fast, "_fuzzattn_speed", False)
    for value in values + [3, -2.5, True, 2**40, tl.constexpr(5)]:
        mine, theirs = fast(sem, value, False), fast.__wrapped__(sem, value, False)
        if isinstance(value, tl.tensor):
            assert mine is value is theirs
        else:
            assert _same_value(mine, theirs)
    assert fast(sem, "text", False) == "text" == fast.__wrapped__(sem, "text", False)
    with pytest.raises(TypeError, match="cannot convert"):
        fast(sem, "text")
    assert isinstance(interpreter.interpreter_semantic, type(sem))
