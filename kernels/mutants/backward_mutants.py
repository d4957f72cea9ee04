"""Seeded bugs in the Triton FlashAttention-2 backward (kernels/triton_fa2_backward.py).

Each mutant is the real backward launched through the real launcher `triton_fa2_backward(...,
kernels=...)` with one or more of its three kernels replaced by a copy carrying one checked
source edit (edit.py): validation, allocation, grids and launch arguments are the real ones, and
an edit whose target text disappears from the real kernel stops the import instead of planting
nothing. A bug that naturally lives in two kernels (the same line in the dK/dV and the dQ pass)
is planted in both, as one logical edit.

`BACKWARD_MUTANTS` is a tuple of (name, description, backward_fn); backward_fn has the signature
of `triton_fa2_backward`; `SENTINEL_MUTANTS` the same for the bugs only scores past a finite
mask sentinel show. `MUTANTS` registers each as an `Implementation` of triton_fa2 whose
forward is the real one and whose `backward_fn` is the mutated backward, so the engine's gradient
checks (fuzzattn/gradients/gradient_verdicts.py) must kill it; the forward checks all pass.

Not planted: a dQ accumulation race. The real backward computes dQ in a second pass where each
program owns its rows (no atomics, see the kernel module's docstring), so there is no shared
accumulator whose atomic add could be weakened into a racy load + store; and under the CPU
interpreter programs run one after another, so a race could not show here anyway.

All mutants only read and write inside the buffers the real kernel touches (no mask removed
from a load or store), so they are safe to run under the interpreter in the fuzzing process.
"""
from __future__ import annotations

from pathlib import Path

from fuzzattn.contract import Implementation
from fuzzattn.kernels import triton_fa2
from fuzzattn.kernels.triton_fa2_backward import KERNELS, bwd_dq_kernel, triton_fa2_backward

from .edit import mutate

_LOG2E = "1.4426950408889634"

# (name, what is planted, {kernel key in KERNELS: [(old, new), ...]})
BACKWARD_BUGS = (
    ("mutant_bwd_dkdv_ignores_causal",
     "dK/dV pass drops the causal mask (triton #4541): keys get gradient from queries that "
     "cannot see them; block skipping still hides whole blocks, so only the diagonal leaks",
     {"dkdv": [("keep = keep & (offs_n[:, None] <= offs_m[None, :] + CAUSAL_SHIFT)",
                "keep = keep")]}),
    ("mutant_bwd_delta_from_dout",
     "preprocess computes Delta = rowsum(dO * dO) instead of rowsum(dO * O)",
     {"preprocess": [("delta = tl.sum(o * do, axis=1)", "delta = tl.sum(do * do, axis=1)")]}),
    ("mutant_bwd_ds_unscaled",
     "softmax scale left out of dS: dK = dS^T Q and dQ = dS K, the gradient w.r.t. the "
     "unscaled scores",
     {"dkdv": [("dk = dk * scale", "dk = dk")],
      "dq": [("dq = dq * scale", "dq = dq")]}),
    ("mutant_bwd_lse_base2",
     "backward recomputes P with exp2 (log2-scaled scores) but subtracts the forward's "
     "natural-log lse unconverted (pytorch #181645 class)",
     {"dkdv": [("p_t = tl.exp(s_t - lse_safe[None, :])",
                f"p_t = tl.exp2(s_t * {_LOG2E} - lse_safe[None, :])")],
      "dq": [("p = tl.exp(s - lse_safe[:, None])",
              f"p = tl.exp2(s * {_LOG2E} - lse_safe[:, None])")]}),
    ("mutant_bwd_gqa_first_head_only",
     "GQA dK/dV not summed over the group: only the group's first query head contributes",
     {"dkdv": [("for g in range(GROUP_SIZE):", "for g in range(1):")]}),
    ("mutant_bwd_dq_skips_key_block",
     "causal dQ loop bound uses BLOCK_N for the query block's height: when BLOCK_M > BLOCK_N "
     "the last visible key block(s) of each query block are skipped",
     {"dq": [("hi = tl.minimum(pid_m * BLOCK_M + BLOCK_M + CAUSAL_SHIFT, N_KEYS)",
              "hi = tl.minimum(pid_m * BLOCK_M + BLOCK_N + CAUSAL_SHIFT, N_KEYS)")]}),
)


def _backward(planted: dict, name: str):
    """triton_fa2_backward with the `planted` kernels swapped in, named after the mutant."""

    def backward(q, k, v, out, lse, dout, *, causal, scale, window=(-1, -1), softcap=0.0,
                 config=None, kernels=None):
        # The real launcher's signature; the planted kernels win over any the caller passes.
        chosen = dict(kernels or {}, **planted)
        return triton_fa2_backward(q, k, v, out, lse, dout, causal=causal, scale=scale,
                                   window=window, softcap=softcap, config=config, kernels=chosen)

    backward.__name__ = backward.__qualname__ = name
    return backward


class _DqGridFloor:
    """Stands in for bwd_dq_kernel: launched over Nq // BLOCK_M query blocks instead of
    cdiv(Nq, BLOCK_M), so the last partial block's dq rows are never written (they keep whatever
    torch.empty handed out). Reads and writes stay inside the real buffers."""

    def __getitem__(self, grid):
        def launch(*args, **meta):
            blocks = args[0].shape[2] // meta["BLOCK_M"]      # args[0] is q: (B, H, Nq, D)
            if blocks == 0:
                return None                                  # nothing launched at all
            return bwd_dq_kernel[(blocks,) + tuple(grid[1:])](*args, **meta)
        return launch


# Bugs that ordinary values never show: a finite mask sentinel loses only to scores past it.
# Kept apart from BACKWARD_MUTANTS, each of which differs from float64 on ordinary values
# (tests/kernels/test_triton_backward.py); their case is a sentinel_sweep one (tests/kernels/test_mutants.py).
SENTINEL_BUGS = (
    ("mutant_bwd_sentinel_minus_1e4",
     "backward masks recomputed scores with -1e4 instead of -inf (the sentinel of many "
     "attention codes): hidden keys get P = exp(-1e4 - lse), which is 0 until real scores, and "
     "so lse, fall below about -1e4",
     {"dkdv": [('s_t = tl.where(keep, s_t, float("-inf"))', "s_t = tl.where(keep, s_t, -1.0e4)")],
      "dq": [('s = tl.where(keep, s, float("-inf"))', "s = tl.where(keep, s, -1.0e4)")]}),
)

LAUNCH_BUGS = (
    ("mutant_bwd_dq_grid_floor",
     "dQ pass launched over Nq // BLOCK_M query blocks instead of cdiv: the rows of the last "
     "partial block are never written",
     {"dq": _DqGridFloor()}),
)


def _edited(bugs) -> list:
    built = []
    for name, description, edits_by_kernel in bugs:
        kernels = {key: mutate(KERNELS[key], edits, name=f"{name}[{key}]")
                   for key, edits in edits_by_kernel.items()}
        built.append((name, description, _backward(kernels, name)))
    return built


def _build():
    built = _edited(BACKWARD_BUGS)
    for name, description, kernels in LAUNCH_BUGS:
        built.append((name, description, _backward(kernels, name)))
    return tuple(built)


BACKWARD_MUTANTS = _build()
SENTINEL_MUTANTS = tuple(_edited(SENTINEL_BUGS))

_SOURCES = (str(Path(__file__).resolve()),) + triton_fa2.IMPL.sources
# The real forward (its checks pass), the mutated backward: only the gradient checks can kill these.
MUTANTS = tuple(Implementation(name=name, fn=triton_fa2.IMPL.fn, caps=triton_fa2.IMPL.caps,
                               description=description, mutant_of=triton_fa2.IMPL.name,
                               backend="triton", sources=_SOURCES, backward_fn=backward)
                for name, description, backward in BACKWARD_MUTANTS + SENTINEL_MUTANTS)
