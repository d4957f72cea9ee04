"""Purpose-built kernels for the autotuner-semantics, keep-going and probe tests.

Each computes correct attention with plain torch, around something it gets wrong on purpose:
a Triton launch whose `tl.static_assert` fails for some configurations (as a kernel whose tile
must not be wider than the head dim), real Triton exception classes raised for chosen
configurations, two seeded edits of torch_tiled in one kernel, a failing first call.
"""
from __future__ import annotations

import math

import torch

import fuzzattn  # noqa: F401  (before triton: chooses its interpreter on a machine without a GPU)
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError, CompileTimeAssertionFailure
from triton.runtime.errors import OutOfResources, PTXASError

from fuzzattn import Capabilities, Implementation
from fuzzattn.kernels import torch_tiled
from fuzzattn.kernels.mutants.edit import mutate
from fuzzattn.kernels.mutants.torch_mutants import TILED_BUGS
from fuzzattn.kernels.mutants.triton_mutants import combined


def reference(q, k, v, *, causal, scale):
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if causal:
        hidden = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(hidden, float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype), torch.logsumexp(s, -1)


@triton.jit
def _tile_check(X, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    tl.static_assert(BLOCK <= HEAD_DIM, "BLOCK must not exceed the head dim")
    offsets = tl.arange(0, 16)
    tl.store(X + offsets, tl.load(X + offsets) + 1.0)


def tiled(q, k, v, *, causal, scale, config):
    """Correct, but its tile check does not compile where BLOCK > D."""
    _tile_check[(1,)](torch.zeros(16, device=q.device), BLOCK=config["BLOCK"],
                      HEAD_DIM=q.shape[-1])
    return reference(q, k, v, causal=causal, scale=scale)


_BASE = dict(dtypes={"float32"}, head_dims={16, 32, 64}, causal=(), strides="contiguous")

# D=16 prunes BLOCK 32 and 64, D=32 prunes 64: BLOCK=16 always compiles.
STATIC_ASSERT = Implementation("static_assert_tiles", tiled, Capabilities(
    **_BASE, configs={"BLOCK": (16, 32, 64)}))
# No BLOCK compiles for D=16: what an autotuner would meet in production.
NONE_COMPILES = Implementation("none_compile_for_d16", tiled, Capabilities(
    **_BASE, configs={"BLOCK": (32, 64)}))
# The same kernel declared with pruning off: every compile failure is a crash.
NOT_PRUNED = Implementation("static_assert_not_pruned", tiled, Capabilities(
    **_BASE, configs={"BLOCK": (16, 32, 64)}, prune_compile_errors=False))


def raising(q, k, v, *, causal, scale, config):
    """Raises the real exception classes for chosen configurations of D=64, else correct."""
    if q.shape[-1] == 64 and config["STAGES"] == 4:
        raise OutOfResources(278592, 232448, "shared memory")
    if q.shape[-1] == 64 and config["STAGES"] == 3:
        raise PTXASError("ptxas fatal: Unresolved extern function")
    if q.shape[-1] == 16 and config["STAGES"] > 1:
        raise CompileTimeAssertionFailure("tl.static_assert(BLOCK_N <= HEAD_DIM)", None,
                                          "BLOCK_N > HEAD_DIM")
    if q.shape[-1] == 32 and config["STAGES"] == 2:
        raise CompilationError("def kernel(): ...", None, "internal compiler error")
    return reference(q, k, v, causal=causal, scale=scale)


RAISING = Implementation("raising_configs", raising, Capabilities(
    **_BASE, configs={"STAGES": (1, 2, 3, 4)}))


# Two seeded edits of torch_tiled in one kernel, on disjoint cases: chunks (1 < Nq < Nk) aligned
# to the wrong end of the keys (wrong values) and no safe max (rows with no visible key: NaN).
_EDITS = {name: edits for name, _, edits in TILED_BUGS}
_FP32 = dict(dtypes={"float32"}, head_dims=None, max_head_dim=16,
             causal=("top_left", "bottom_right"), strides="any")
TWO_BUGS = Implementation("two_bugs", mutate(
    torch_tiled.torch_tiled_forward,
    _EDITS["mutant_chunk_wrong_alignment"] + _EDITS["mutant_empty_rows_nan"], name="two_bugs"),
    Capabilities(**_FP32))
# A compiled Triton kernel with two causes: triton_fa2's forward with the diagonal key hidden
# (needs a causal mask) and GQA's kv heads interleaved instead of grouped (needs GQA).
TRITON_TWO_BUGS = combined("triton_two_bugs", "mutant_causal_off_by_one", "mutant_gqa_modulo")
ONE_BUG = Implementation("one_bug", mutate(
    torch_tiled.torch_tiled_forward, _EDITS["mutant_empty_rows_nan"], name="one_bug"),
    Capabilities(**_FP32))


def fails_on_16(q, k, v, *, causal, scale):
    """A plain callable that crashes on 16-key inputs (the loader's probe case) only."""
    if k.shape[-2] == 16:
        raise RuntimeError("kernel launch failed for 16 keys")
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), -math.inf)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def wrong_signature(q, k):
    return q
