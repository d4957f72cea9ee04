"""Purpose-built bad implementations for tests/isolation/test_isolation.py.

Each is correct (SDPA for out, an fp32 logsumexp for lse) until q has at least THRESHOLD query
rows, and then fails in one of the ways only a supervised worker process survives: it hangs, it
kills its own process with SIGSEGV, or it raises the error a CUDA device fault raises. A shrunk
counterexample therefore has seq_q == THRESHOLD exactly.

They are Implementation objects (not plain callables) so that the capabilities are declared:
the loader then has nothing to learn from its probe call, which runs at seq_q=16 and would hang
or die here. Load them with `load_implementation(spec, probe=False)`, or `isolation.load_isolated`.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fuzzattn.contract import Capabilities, Implementation

THRESHOLD = 5

# Small and plain: fp32 only, one head dim, no GQA, any strides. Strategies drawn from these caps
# stay cheap, and shrinking has few dimensions besides seq_q to work on.
CAPS = Capabilities(dtypes={"float32"}, head_dims={16}, causal=("top_left",), gqa=False,
                    strides="any", returns_lse=True)


def _attention(q, k, v, *, causal, scale):
    causal, scale = CAPS.check_inputs(q, k, v, causal=causal, scale=scale)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal == "top_left", scale=scale)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if causal == "top_left":
        visible = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    return out, torch.logsumexp(scores, dim=-1)


def _at_threshold(q) -> bool:
    return q.shape[2] >= THRESHOLD


def correct(q, k, v, *, causal, scale):
    return _attention(q, k, v, causal=causal, scale=scale)


def hang_at_5(q, k, v, *, causal, scale):
    while _at_threshold(q):
        time.sleep(3600)        # a loop bound that never ends, without spinning a shared core
    return _attention(q, k, v, causal=causal, scale=scale)


def segfault_at_5(q, k, v, *, causal, scale):
    if _at_threshold(q):
        ctypes.string_at(0)     # reads address 0: a real SIGSEGV, as a faulting extension gives
    return _attention(q, k, v, causal=causal, scale=scale)


def device_fault_at_5(q, k, v, *, causal, scale):
    if _at_threshold(q):
        # What torch raises after a kernel's illegal access; stands in for one on the CPU.
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return _attention(q, k, v, causal=causal, scale=scale)


def backward_device_fault_at_5(q, k, v, out, lse, dout, *, causal, scale):
    """A backward that faults the device from seq_q >= 5 (the forward is right everywhere)."""
    if _at_threshold(q):
        raise RuntimeError("CUDA error: misaligned address")
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out, _ = _attention(q, k, v, causal=causal, scale=scale)
        return torch.autograd.grad(out, (q, k, v), dout)


def abort_once(q, k, v, *, causal, scale):
    """Kills its process the first time it sees seq_q == 7 and passes ever after: the marker file
    named by FUZZATTN_TEST_ONCE remembers across the worker restart. Shows a campaign goes on."""
    marker = Path(os.environ["FUZZATTN_TEST_ONCE"])
    if q.shape[2] == 7 and not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGSEGV)
    return _attention(q, k, v, causal=causal, scale=scale)


def _impl(fn, what: str) -> Implementation:
    return Implementation(name=fn.__name__, fn=fn, caps=CAPS, description=what,
                          sources=(str(Path(__file__).resolve()),))


CORRECT = _impl(correct, "SDPA plus an fp32 lse: passes everything")
HANG = _impl(hang_at_5, "sleeps forever when seq_q >= 5")
SEGFAULT = _impl(segfault_at_5, "reads address 0 (SIGSEGV) when seq_q >= 5")
DEVICE_FAULT = _impl(device_fault_at_5, "raises a CUDA illegal-memory-access error when seq_q >= 5")
BACKWARD_DEVICE_FAULT = Implementation(
    name="backward_device_fault_at_5", fn=correct, backward_fn=backward_device_fault_at_5,
    caps=dataclasses.replace(CAPS, backward=True),
    description="a correct forward whose backward raises a CUDA misaligned-address error when "
                "seq_q >= 5", sources=(str(Path(__file__).resolve()),))
ABORT_ONCE = _impl(abort_once, "SIGSEGV once, at the first seq_q == 7 case; correct afterwards")

COMPILE_SECONDS = 1.5
_compiled_shapes: set = set()


def compile_per_shape(q, k, v, *, causal, scale):
    """Takes COMPILE_SECONDS on its process's first call of each shape, as a torch.compile'd
    kernel compiling it does; hangs at seq_q >= 5 while the file FUZZATTN_TEST_HANG names exists."""
    shape = (*q.shape, *k.shape)
    if shape not in _compiled_shapes:
        _compiled_shapes.add(shape)
        time.sleep(COMPILE_SECONDS)         # the compile's cost, which the judge must absorb
    while _at_threshold(q) and Path(os.environ["FUZZATTN_TEST_HANG"]).exists():
        time.sleep(3600)                    # a hang, as in hang_at_5
    return _attention(q, k, v, causal=causal, scale=scale)


COMPILING = Implementation(name="compile_per_shape", fn=compile_per_shape,
                           caps=dataclasses.replace(CAPS, compiles_per_shape=True),
                           description="compiles on each shape's first call; hangs at seq_q >= 5 after")
COMPILING_UNDECLARED = dataclasses.replace(COMPILING, name="compile_per_shape_undeclared", caps=CAPS)


# -- a real device fault (CUDA only) ------------------------------------------------------------
def triton_oob_store(q, k, v, *, causal, scale):
    """Correct output, then a Triton kernel stores far outside any allocation when seq_q >= 5:
    an illegal memory access on a GPU, which poisons the process's CUDA context."""
    out, lse = _attention(q, k, v, causal=causal, scale=scale)
    if _at_threshold(q):
        _oob_store_kernel()[(1,)](out, 1 << 40)
    return out, lse


_KERNEL = None


def _oob_store_kernel():
    # Decorated on first use, after fuzzattn has chosen the Triton backend.
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def oob_store(ptr, offset):
            tl.store(ptr + offset, 1.0)   # 2**40 elements past the output tensor: unmapped

        _KERNEL = oob_store
    return _KERNEL


TRITON_OOB = _impl(triton_oob_store, "Triton store 2**40 elements out of range when seq_q >= 5")
