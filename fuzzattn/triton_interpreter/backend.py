"""Triton backend selection, and the repairs of bf16 arithmetic in Triton's CPU interpreter.

Kernels run compiled on a CUDA GPU and under the interpreter (TRITON_INTERPRET=1) elsewhere.
`@triton.jit` reads that variable when it decorates, so `ensure_backend()` runs before any kernel
module is imported. Under the interpreter it also refuses numpy >= 2.3 with triton 3.6 (its
`range(tl.cdiv(...))` raises), and, for a triton inside fence.TESTED, patches:

* `InterpreterBuilder.create_dot`: bf16 operands are kept as uint16 and their raw bits multiplied
  (~1e9 off). They are cast to fp32 first: bf16 products are exact in fp32, as on the GPU.
* `InterpreterBuilder.cast_impl`: fp32 -> bf16 truncates; compiled Triton and torch round to
  nearest even. Truncation would show as kernel errors (up to 1 ulp) the GPU does not have.
* speed.py's and semantic.py's edits, which remove costs without changing results.

A self-check kernel confirms both repairs; `bf16_dot_status()` reports it, and the judge skips
bf16 Triton cases with its reason when they cannot be trusted (also on a triton outside TESTED,
where nothing is patched). Nothing is patched when kernels run compiled.
"""
from __future__ import annotations

import os
import sys

from fuzzattn.triton_interpreter import fence

_REPAIR_MARK = "_fuzzattn_bf16_repair"   # attribute set on our wrapper: makes patching idempotent
_bf16_status: tuple[bool, str] | None = None  # cached result of the self-check


def is_interpreted() -> bool:
    """True when Triton kernels will run under the CPU interpreter."""
    try:
        import triton
        # Triton's own reading of the variable (it accepts 1/true/on/yes): the one that counts.
        return bool(triton.knobs.runtime.interpret)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


# What shows a GPU torch could use on Linux, without importing torch: NVIDIA's driver (its /proc
# folder once the kernel module is loaded, its control device), ROCm's compute device, WSL's GPU
# device. torch.cuda.is_available() cannot be True without one of them.
GPU_SIGNS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def no_gpu() -> bool:
    """Whether torch finds no CUDA (or ROCm) device. On Linux with none of GPU_SIGNS, said
    without importing torch (~2 s of `import fuzzattn` on a CPU machine); elsewhere torch says."""
    if ("torch" not in sys.modules and sys.platform.startswith("linux")
            and not any(os.path.exists(sign) for sign in GPU_SIGNS)):
        return True
    import torch
    return not torch.cuda.is_available()


def select_backend() -> None:
    """Choose the interpreter when there is no GPU. Must run before triton is first imported;
    `import fuzzattn` runs it, so the package can be imported before any kernel."""
    # Respect an explicit choice either way: a user may force the interpreter on a GPU machine,
    # or set TRITON_INTERPRET=0 deliberately.
    if "TRITON_INTERPRET" not in os.environ and no_gpu():
        if "triton.language" in sys.modules:
            # triton.language's own helpers (tl.cdiv, tl.max ...) were @jit-decorated for compiled
            # mode when it was imported; interpreted kernels calling them would crash mid-run.
            raise RuntimeError("triton was imported before fuzzattn could select its CPU "
                               "interpreter: import fuzzattn first, or set TRITON_INTERPRET=1")
        os.environ["TRITON_INTERPRET"] = "1"


def ensure_backend() -> None:
    """select_backend(), then, under the interpreter, refuse broken setups and (on a triton
    inside fence.TESTED) install the bf16 repairs and the speed edits; outside it, patch
    nothing and say so once on stderr.

    Idempotent, and free after the first call that got through. Must run before any
    @triton.jit decoration.
    """
    global _ensured
    if _ensured:
        return
    select_backend()
    if is_interpreted():
        _check_numpy_compatible()
        if not fence.tested():
            fence.say_untested_once()
        else:
            _install_bf16_dot_repair()
            _install_bf16_cast_repair()
            from fuzzattn.triton_interpreter import speed
            speed.install()
    _ensured = True


_ensured = False


def _check_numpy_compatible() -> None:
    """Fail loudly where the interpreter cannot run (numpy_incompatibility)."""
    problem = numpy_incompatibility()
    if problem:
        raise RuntimeError(problem)


def numpy_incompatibility(triton_version: str | None = None) -> str | None:
    """Why Triton's interpreter cannot run with the installed numpy (triton < 3.7 with numpy >=
    2.3: it breaks on `range(tl.cdiv(...))`), else None."""
    import numpy
    import triton

    version = triton_version or triton.__version__
    if fence.release(version) < (3, 7) and fence.release(numpy.__version__) >= (2, 3):
        return (f"triton {version}'s interpreter fails with numpy {numpy.__version__} "
                f"(range(tl.cdiv(N, BLOCK)) raises TypeError): install 'numpy<2.3' (pip install 'numpy<2.3')")
    return None


def _install_bf16_dot_repair() -> bool:
    """Wrap InterpreterBuilder.create_dot so bf16 operands are converted to fp32. True if in place."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    builder_cls = getattr(interp, "InterpreterBuilder", None)
    original = getattr(builder_cls, "create_dot", None)
    cast_impl = getattr(builder_cls, "cast_impl", None)
    if original is None or cast_impl is None:
        return False          # not the structure we know: leave it alone, the self-check will say so
    if getattr(original, _REPAIR_MARK, False):
        return True

    def _as_fp32(builder, handle):
        # TensorHandle.dtype is the scalar Triton type; anything that is not bf16 is left as is,
        # so fp16/fp32/fp8 keep the interpreter's own (correct) paths.
        if getattr(handle, "dtype", None) == tl.bfloat16:
            return builder.cast_impl(handle, tl.float32)
        return handle

    def create_dot(self, a, b, d, *args, **kwargs):
        return original(self, _as_fp32(self, a), _as_fp32(self, b), d, *args, **kwargs)

    setattr(create_dot, _REPAIR_MARK, True)
    create_dot.__wrapped__ = original
    builder_cls.create_dot = create_dot   # a class attribute: every builder instance sees it
    return True


def _fp32_to_bf16_bits(x):
    """fp32 array -> bf16 bit patterns (uint16), rounded to nearest even as the GPU does."""
    import numpy as np

    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    # Adding 0x7FFF plus the lowest kept bit, then dropping 16 bits, rounds half to even; a carry
    # out of the mantissa correctly bumps the exponent (and overflows to inf at the top).
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    quiet_nan = ((bits >> 16) & 0x8000) | 0x7FC0      # keep the sign, make sure it stays a NaN
    return np.where(nan, quiet_nan, rounded).astype(np.uint16)


def _install_bf16_cast_repair() -> bool:
    """Wrap InterpreterBuilder.cast_impl so fp32 -> bf16 rounds to nearest even. True if in place."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    builder_cls = getattr(interp, "InterpreterBuilder", None)
    original = getattr(builder_cls, "cast_impl", None)
    handle_cls = getattr(interp, "TensorHandle", None)
    if original is None or handle_cls is None:
        return False
    if getattr(original, _REPAIR_MARK, False):
        return True

    # create_fp_trunc and friends are lambdas calling self.cast_impl, so one wrapper covers them.
    def cast_impl(self, src, dst_type):
        dst = getattr(dst_type, "scalar", dst_type)
        if getattr(src, "dtype", None) == tl.float32 and dst == tl.bfloat16:
            return handle_cls(_fp32_to_bf16_bits(src.data), tl.bfloat16)
        return original(self, src, dst_type)

    setattr(cast_impl, _REPAIR_MARK, True)
    cast_impl.__wrapped__ = original
    builder_cls.cast_impl = cast_impl
    return True


def _build_check_kernel():
    """The self-check kernel, decorated only now so it honours the backend ensure_backend chose."""
    import triton
    import triton.language as tl

    @triton.jit
    def _bf16_dot_check_kernel(a_ptr, b_ptr, c_ptr, c16_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :])
        b = tl.load(b_ptr + offs[:, None] * BLOCK + offs[None, :])
        c = tl.dot(a, b)   # bf16 x bf16 -> fp32
        tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], c)
        tl.store(c16_ptr + offs[:, None] * BLOCK + offs[None, :], c.to(tl.bfloat16))

    return _bf16_dot_check_kernel


def _run_bf16_dot_check() -> tuple[bool, str]:
    import torch
    import triton

    block = 16
    g = torch.Generator().manual_seed(0)
    a = torch.randn(block, block, generator=g).to(torch.bfloat16)
    b = torch.randn(block, block, generator=g).to(torch.bfloat16)
    c = torch.empty(block, block, dtype=torch.float32)
    c16 = torch.empty(block, block, dtype=torch.bfloat16)
    try:
        _build_check_kernel()[(1,)](a, b, c, c16, BLOCK=block)
    except Exception as exc:  # noqa: BLE001 - any failure means bf16 dot is unusable; say why
        return False, (f"triton {triton.__version__} interpreter: bf16 tl.dot self-check raised "
                       f"{type(exc).__name__}: {exc}".splitlines()[0])
    expected = a.float() @ b.float()
    err = (c - expected).abs().max().item()
    # Products are exact in fp32; only the summation order differs from torch, so ~1e-6 is the
    # honest size. The raw-bits bug is ~1e9 off: 1e-3 separates them with no ambiguity.
    if not (err == err and err <= 1e-3):
        return False, (f"triton {triton.__version__} interpreter multiplies raw bf16 bits and the fp32 "
                       f"repair could not be applied: max error {err:.3g} on a 16x16x16 bf16 dot")
    # The cast is checked on the kernel's own fp32 result, so the dot's summation order is moot.
    mismatched = int((c16.view(torch.int16) != c.to(torch.bfloat16).view(torch.int16)).sum())
    if mismatched:
        return False, (f"triton {triton.__version__} interpreter truncates fp32 -> bf16 casts and the "
                       f"round-to-nearest repair could not be applied: {mismatched}/256 values differ")
    return True, (f"interpreted; bf16 tl.dot and fp32->bf16 cast repaired "
                  f"(max dot error {err:.1e}, casts exact on a 16x16x16 check)")


def bf16_dot_status() -> tuple[bool, str]:
    """(ok, reason): can Triton kernels be trusted with bf16 tl.dot and casts on this backend?

    Compiled: (True, "compiled"). Interpreted: the cached outcome of a one-off self-check, or,
    on a triton outside fence.TESTED (no repairs installed), (False, the version's reason).
    """
    global _bf16_status
    if _bf16_status is None:
        ensure_backend()
        if not is_interpreted():
            _bf16_status = (True, "compiled")
        elif not fence.tested():
            _bf16_status = (False, fence.untested(
                "the interpreter's bf16 tl.dot and fp32->bf16 cast repairs are not applied"))
        else:
            _bf16_status = _run_bf16_dot_check()
    return _bf16_status
