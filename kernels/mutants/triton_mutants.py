"""Seeded bugs in the Triton FlashAttention-2 forward (kernels/triton_fa2.py).

Two kinds, both launched through the real launcher `triton_fa2_forward(..., kernel=...)`, so
validation, allocation and the launch arguments are the real kernel's:

* kernel bugs: `fa2_fwd_kernel` with one source edit (see edit.py), e.g. the article's phantom
  padded keys and no-op cast of P, a causal off-by-one, a finite mask sentinel;
* launch bugs: the real kernel launched with one thing wrong on the host side (the grid or an
  argument), through a stand-in object in the `kernel=` slot that alters the launch.

Memory safety of the harness is a design constraint here: under Triton's interpreter a kernel's
loads and stores touch this process's memory directly, so a mutant must not write outside memory
the harness owns (a write past a buffer corrupts the heap of the fuzzing process itself).
Mutants whose natural form writes far out of bounds are planted in a bounded form: the missing
store mask is on the lse store (at most BLOCK_M - 1 elements past the end, inside the judge's
256-element canary), and that mutant pads the lse it allocates itself when the caller passes
none. A missing mask on the out store would write up to (BLOCK_M - 1) * D elements past the out
buffer, beyond the canary for D > 16, so it is not planted. Mutants that only read out of bounds
(the V load without its key bound) stay within a few rows of the tensor's guard region.
"""
from __future__ import annotations

import inspect
import math
from pathlib import Path

import torch

from fuzzattn.contract import Implementation
from kernels import triton_fa2
from kernels.triton_fa2 import BLOCK_M, fa2_fwd_kernel, triton_fa2_forward

from .edit import mutate

_SOURCES = (str(Path(__file__).resolve()), str(Path(triton_fa2.__file__).resolve()))
_ARG_NAMES = [name for name, p in inspect.signature(fa2_fwd_kernel.fn).parameters.items()
              if p.annotation is inspect.Parameter.empty or "constexpr" not in str(p.annotation)]


def _forward(kernel, name: str, pad_lse: bool = False):
    """The real launcher with `kernel` in place of fa2_fwd_kernel, named after the mutant."""

    def forward(q, k, v, *, causal, scale, out=None, lse=None):
        if pad_lse and lse is None:
            # The planted bug stores lse rows past Nq; give it room inside memory we own.
            rows = math.prod(q.shape[:3])
            lse = torch.empty(rows + BLOCK_M, dtype=torch.float32, device=q.device)[:rows]
            lse = lse.view(q.shape[:3])
        return triton_fa2_forward(q, k, v, causal=causal, scale=scale, out=out, lse=lse,
                                  kernel=kernel)

    forward.__name__ = forward.__qualname__ = name
    return forward


def _implementation(name: str, description: str, kernel, **forward_options) -> Implementation:
    real = triton_fa2.IMPL
    return Implementation(name=name, fn=_forward(kernel, name, **forward_options), caps=real.caps,
                          description=description, mutant_of=real.name, backend="triton",
                          sources=_SOURCES, backward_fn=real.backward_fn)   # forward bugs only


class _AlteredLaunch:
    """Stands in for fa2_fwd_kernel in the launcher's `kernel=` slot: `alter(grid, args)`
    returns the grid and the named arguments the real kernel is then launched with."""

    def __init__(self, alter):
        self.alter = alter

    def __getitem__(self, grid):
        def launch(*args, **meta):
            named = dict(zip(_ARG_NAMES, args))
            if len(named) != len(args):
                raise TypeError(f"expected {len(_ARG_NAMES)} launch arguments, got {len(args)}")
            new_grid, named = self.alter(tuple(grid), dict(named))
            return fa2_fwd_kernel[new_grid](*named.values(), **meta)
        return launch


# -- kernel bugs: (name, what is planted, edits to fa2_fwd_kernel's source) ----------------------
KERNEL_BUGS = (
    ("mutant_phantom_keys",
     "the article's bug 2: no `k_pos < N_KEYS` mask, so zero-padded keys past Nk score 0 and vote",
     [("keep = mask_n[None, :]", "keep = offs_kn[None, :] >= 0")]),
    ("mutant_noop_p_cast",
     "the article's bug 1: `p.to(v.dtype)` result discarded, so bf16/fp16 P @ V mixes dtypes",
     [("p = p.to(v.dtype)", "p.to(v.dtype)")]),
    ("mutant_tile_index_as_row",
     "query tile start is program_id instead of program_id * BLOCK_M (offsets in tiles, not rows)",
     [("offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)", "offs_m = pid_m + tl.arange(0, BLOCK_M)")]),
    ("mutant_lse_store_unmasked",
     "last query tile's boundary check left out of the lse store: writes lse rows past Nq",
     [("tl.store(l_base + offs_m * stride_lm, lse, mask=mask_m)",
       "tl.store(l_base + offs_m * stride_lm, lse)")]),
    ("mutant_v_load_unmasked",
     "V tile loaded without the key bound: rows past Nk enter P @ V as 0 * (whatever is there)",
     [("v = tl.load(v_ptrs, mask=mask_n[:, None] & mask_d[None, :], other=0.0)",
       "v = tl.load(v_ptrs, mask=mask_d[None, :], other=0.0)")]),
    ("mutant_q_load_past_head_dim",
     "Q loaded without the head-dim mask: columns D..BLOCK_D-1 read past each row",
     [("q = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)",
       "q = tl.load(q_ptrs, mask=mask_m[:, None], other=0.0)")]),
    ("mutant_causal_off_by_one",
     "causal mask j < i instead of j <= i: the diagonal key is hidden",
     [("offs_kn[None, :] <= offs_m[:, None]", "offs_kn[None, :] < offs_m[:, None]")]),
    ("mutant_finite_sentinel",
     "masked scores set to -1e6 instead of -inf: masked keys out-vote real scores below -1e6",
     [('s = tl.where(keep, s, float("-inf"))', "s = tl.where(keep, s, -1.0e6)")]),
    ("mutant_lse_base2",
     "lse stored in base 2 (log2-sum-exp2, as exp2-based kernels keep it) instead of natural log",
     [("m_i + tl.log(l_i))", "(m_i + tl.log(l_i)) * 1.4426950408889634)")]),
    ("mutant_head_dim_truncated",
     "scores use only the first 32 head dims of q (as triton #621 used 64 of 128)",
     [("q = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)",
       "q = tl.load(q_ptrs, mask=mask_m[:, None] & (mask_d & (offs_d < 32))[None, :], other=0.0)")]),
    ("mutant_gqa_modulo",
     "GQA kv head is h % Hkv instead of h // group (interleaved instead of grouped heads)",
     [("pid_hkv = pid_h // GROUP_SIZE", "pid_hkv = pid_h % (tl.num_programs(1) // GROUP_SIZE)")]),
    ("mutant_row_sum_low_precision",
     "running row sum l rounded to the input dtype (bf16/fp16) after every key tile",
     [("l_i = l_i * alpha + tl.sum(p, axis=1)",
       "l_i = (l_i * alpha + tl.sum(p, axis=1)).to(Q.dtype.element_ty).to(tl.float32)")]),
    ("mutant_no_running_max",
     "no running maximum: p = exp(s) without subtracting m, which overflows for large scores",
     [("m_new = tl.maximum(m_i, tl.max(s, axis=1))", "m_new = tl.zeros_like(m_i)")]),
    ("mutant_row_sum_not_rescaled",
     "online softmax forgets to rescale the row sum l by alpha when the running max grows",
     [("l_i = l_i * alpha + tl.sum(p, axis=1)", "l_i = l_i + tl.sum(p, axis=1)")]),
)


# -- launch bugs: (name, what is planted, alter(grid, args) -> (grid, args)) ----------------------
def _grid_floor(grid, args):
    return (args["N_QUERIES"] // BLOCK_M,) + grid[1:], args


def _packed_kv_rows(grid, args):
    # Batch and head strides stay real, so every address stays inside K's and V's storage.
    for t in "kv":
        args[f"stride_{t}n"], args[f"stride_{t}d"] = args["HEAD_DIM"], 1
    return grid, args


def _default_scale(grid, args):
    args["scale"] = 1.0 / math.sqrt(args["HEAD_DIM"])
    return grid, args


LAUNCH_BUGS = (
    ("mutant_grid_floor",
     "grid is Nq // BLOCK_M instead of cdiv: the last partial query tile is never launched",
     _grid_floor),
    ("mutant_packed_kv_strides",
     "launcher passes D and 1 as K/V row and column strides (contiguous rows assumed)",
     _packed_kv_rows),
    ("mutant_scale_ignored",
     "launcher passes 1/sqrt(D) whatever scale the caller asked for",
     _default_scale),
)


def _build() -> tuple[Implementation, ...]:
    built = []
    for name, description, edits in KERNEL_BUGS:
        kernel = mutate(fa2_fwd_kernel, edits, name=name)
        built.append(_implementation(name, description, kernel,
                                     pad_lse=name == "mutant_lse_store_unmasked"))
    for name, description, alter in LAUNCH_BUGS:
        built.append(_implementation(name, description, _AlteredLaunch(alter)))
    return tuple(built)


MUTANTS = _build()
