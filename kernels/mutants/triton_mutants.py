"""Seeded bugs in the Triton FlashAttention-2 forward (kernels/triton_fa2.py).

Two kinds, both launched through the real launcher `triton_fa2_forward(..., kernel=...)`, so
validation, allocation, configuration handling (pinned or autotuned) and the launch arguments
are the real kernel's:

* kernel bugs: `fa2_fwd_kernel` (or its key-block helper `_attend_key_blocks`) with one source
  edit (see edit.py), e.g. the article's phantom padded keys and no-op cast of P, a causal
  off-by-one, a finite mask sentinel;
* launch bugs: the real kernel launched with one thing wrong on the host side (the grid or an
  argument), through a stand-in object in the `kernel=` slot that alters the launch.

Some bugs show only in some configurations: the stage bounds of causal block skipping and the
mask-free fast path are exact for the article's 16x16 tiles on most shapes and wrong for other
tile shapes (see each description). Every wrapper takes the launcher's `config=` (None: the
baseline under the interpreter, the autotuner's choice compiled) and passes it through.

Memory safety of the harness is a design constraint here: under Triton's interpreter a kernel's
loads and stores touch this process's memory directly, so a mutant must not write outside memory
the harness owns (a write past a buffer corrupts the heap of the fuzzing process itself).
Mutants whose natural form writes far out of bounds are planted in a bounded form: the missing
store mask is on the lse store (at most BLOCK_M - 1 <= 127 elements past the end, inside the
judge's 4096-element canary), and that mutant pads the lse it allocates itself when the caller
passes none. A missing mask on the out store would write up to (BLOCK_M - 1) * D elements past
the out buffer, beyond the canary, so it is not planted. Mutants that only read out of bounds
(rows past Nk: V without its key bound, the mask-free path on a ragged block, a diagonal stage
that starts mid-block) read at most BLOCK_N - 1 rows past the end: inside the inputs' NaN guard
(16 rows or more) for BLOCK_N = 16, and for wider key blocks from a NaN-padded copy of k and v
that the mutant makes itself, so the rows it reads are memory it owns.
"""
from __future__ import annotations

import inspect
import math
from pathlib import Path

import torch

from fuzzattn.contract import Implementation
from fuzzattn.inputs.materialize import GUARD_ROWS
from fuzzattn.triton_interpreter.backend import is_interpreted
from fuzzattn.kernels import triton_fa2
from fuzzattn.kernels.triton_fa2 import CONFIG_SPACE, _attend_key_blocks, fa2_fwd_kernel, triton_fa2_forward

from .edit import mutate

_SOURCES = (str(Path(__file__).resolve()),) + triton_fa2.IMPL.sources
_ARG_NAMES = [name for name, p in inspect.signature(fa2_fwd_kernel.fn).parameters.items()
              if p.annotation is inspect.Parameter.empty or "constexpr" not in str(p.annotation)]


_MAX_BLOCK_M = max(CONFIG_SPACE["BLOCK_M"])
_MAX_BLOCK_N = max(CONFIG_SPACE["BLOCK_N"])


def _forward(kernel, name: str, pad_lse: bool = False, pad_kv: bool = False):
    """The real launcher with `kernel` in place of fa2_fwd_kernel, named after the mutant."""

    def forward(q, k, v, *, causal, scale, window=(-1, -1), softcap=0.0, out=None, lse=None,
                config=None):
        if pad_lse and lse is None:
            # The planted bug stores lse rows past Nq; give it room inside memory we own.
            rows = math.prod(q.shape[:3])
            lse = torch.empty(rows + _MAX_BLOCK_M, dtype=torch.float32, device=q.device)[:rows]
            lse = lse.view(q.shape[:3])
        if pad_kv and _may_read_past_guard(config) and _is_kv(k) and _is_kv(v):
            # The planted bug reads up to BLOCK_N - 1 rows past Nk, more than the inputs' guard
            # holds for BLOCK_N > 16: read them from NaN rows of a copy we own instead.
            k, v = _nan_rows_after(k), _nan_rows_after(v)
        return triton_fa2_forward(q, k, v, causal=causal, scale=scale, window=window,
                                  softcap=softcap, out=out, lse=lse, config=config, kernel=kernel)

    forward.__name__ = forward.__qualname__ = name
    return forward


def _may_read_past_guard(config) -> bool:
    """Whether the launch may use key blocks wider than the inputs' guard covers."""
    if config is None:
        return not is_interpreted()        # compiled, the autotuner may pick any BLOCK_N
    block_n = config.get("BLOCK_N") if isinstance(config, dict) else None
    return not (isinstance(block_n, int) and block_n <= GUARD_ROWS)


def _is_kv(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 4     # anything else: the launcher refuses


def _nan_rows_after(t: torch.Tensor) -> torch.Tensor:
    """`t` (B, H, N, D) copied into storage with _MAX_BLOCK_N NaN rows after its last row."""
    batch, heads, seq, dim = t.shape
    padded = torch.full((batch, heads, seq + _MAX_BLOCK_N, dim), float("nan"), dtype=t.dtype,
                        device=t.device)
    padded[:, :, :seq] = t
    return padded[:, :, :seq]


def _implementation(name: str, description: str, kernel, **forward_options) -> Implementation:
    real = triton_fa2.IMPL
    return Implementation(name=name, fn=_forward(kernel, name, **forward_options), caps=real.caps,
                          description=description, mutant_of=real.name, backend="triton",
                          sources=_SOURCES, backward_fn=real.backward_fn)   # forward bugs only


class _AlteredLaunch:
    """Stands in for fa2_fwd_kernel in the launcher's `kernel=` slot: `alter(grid, args)`
    returns the grid and the named arguments the real kernel is then launched with.

    It quacks like a JITFunction (`[grid](...)`, `run`, `arg_names`, `fn`), so the launcher
    wraps it in @triton.autotune like any kernel: pinned and autotuned launches both reach it.
    """

    def __init__(self, alter):
        self.alter = alter
        self.fn = fa2_fwd_kernel                # the autotuner follows .fn to the Python source
        self.arg_names = fa2_fwd_kernel.arg_names

    def run(self, *args, grid, **meta):
        named = dict(zip(_ARG_NAMES, args))
        if len(named) != len(args):
            raise TypeError(f"expected {len(_ARG_NAMES)} launch arguments, got {len(args)}")
        new_grid, named = self.alter(grid, dict(named))
        return fa2_fwd_kernel.run(*named.values(), grid=new_grid, **meta)

    def __getitem__(self, grid):
        return lambda *args, **meta: self.run(*args, grid=grid, warmup=False, **meta)


# -- kernel bugs: (name, what is planted, edits to fa2_fwd_kernel or _attend_key_blocks) ----------
KERNEL_BUGS = (
    ("mutant_phantom_keys",
     "the article's bug 2: no `k_pos < N_KEYS` mask, so zero-padded keys past Nk score 0 and vote",
     [("keep = offs_kn[None, :] < N_KEYS", "keep = offs_kn[None, :] >= 0")]),
    ("mutant_noop_p_cast",
     "the article's bug 1: `p.to(v.dtype)` result discarded, so bf16/fp16 P @ V mixes dtypes",
     [("p = p.to(v.dtype)", "p.to(v.dtype)")]),
    ("mutant_tile_index_as_row",
     "query tile start is program_id instead of program_id * BLOCK_M (offsets in tiles, not rows)",
     [("start_m = pid_m * BLOCK_M", "start_m = pid_m")]),
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
     "causal mask j < i + shift instead of j <= i + shift: the diagonal key is hidden",
     [("offs_kn[None, :] <= offs_m[:, None] + CAUSAL_SHIFT",
       "offs_kn[None, :] < offs_m[:, None] + CAUSAL_SHIFT")]),
    ("mutant_finite_sentinel",
     "masked scores set to -1e6 instead of -inf: masked keys out-vote real scores below -1e6",
     [('s = tl.where(keep, s, float("-inf"))', "s = tl.where(keep, s, -1.0e6)")]),
    ("mutant_sentinel_minus_1e9",
     "masked scores and the running max start at -1e9 instead of -inf, rows with m <= -1e9 "
     "taken as empty: right until real scores (base 2) fall below -1e9, where hidden keys "
     "out-vote them or the row is zeroed",
     [('s = tl.where(keep, s, float("-inf"))', "s = tl.where(keep, s, -1.0e9)"),
      ('m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)',
       "m_i = tl.full((BLOCK_M,), -1.0e9, dtype=tl.float32)"),
      ("empty = l_i == 0.0", "empty = m_i <= -1.0e9"),
      ("out = acc / l_safe[:, None]", "out = tl.where(empty[:, None], 0.0, acc / l_safe[:, None])")]),
    ("mutant_lse_base2",
     "lse left in base 2 (m + log2 l of the exp2 kernel's scores) without the final ln 2 factor",
     [("(m_i + tl.log2(l_safe)) * 0.6931471805599453)", "(m_i + tl.log2(l_safe)))")]),
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
       "l_i = (l_i * alpha + tl.sum(p, axis=1)).to(q.dtype).to(tl.float32)")]),
    ("mutant_no_running_max",
     "no running maximum: p = exp(s) without subtracting m, which overflows for large scores",
     # Both edits: a kernel without a running max has no p <= 1 bound to clamp to either.
     [("m_new = tl.maximum(m_i, tl.max(s, axis=1))", "m_new = tl.zeros_like(m_i)"),
      ("tl.math.exp2(tl.minimum(s - m_safe[:, None], 0.0, propagate_nan=tl.PropagateNan.ALL))",
       "tl.math.exp2(s - m_safe[:, None])")]),
    ("mutant_row_sum_not_rescaled",
     "online softmax forgets to rescale the row sum l by alpha when the running max grows",
     [("l_i = l_i * alpha + tl.sum(p, axis=1)", "l_i = l_i + tl.sum(p, axis=1)")]),
    # -- bugs of the configurable kernel: they show only for some tile shapes or sizes ---------
    ("mutant_diagonal_bounds_block_m_lt_n",
     "causal diagonal stage starts at the tile's own diagonal key, not rounded down to a key "
     "block: wrong when BLOCK_M < BLOCK_N, or bottom-right with Nk - Nq not a multiple of BLOCK_N",
     [("diag_start = tl.maximum(start_m + CAUSAL_SHIFT + 1, 0) // BLOCK_N * BLOCK_N",
       "diag_start = tl.maximum(start_m + CAUSAL_SHIFT, 0)")]),
    ("mutant_maskfree_ragged_tail",
     "whole-block count rounds Nk up, so the ragged last key block takes the mask-free path: "
     "wrong whenever Nk is not a multiple of BLOCK_N (which BLOCK_N decides)",
     [("n_keys_even = N_KEYS // BLOCK_N * BLOCK_N",
       "n_keys_even = (N_KEYS + BLOCK_N - 1) // BLOCK_N * BLOCK_N")]),
    ("mutant_skip_off_by_one_block",
     "causal skip bound rounds the tile's last visible key down to a key block, skipping the "
     "block that holds it: wrong when BLOCK_M < BLOCK_N or Nk - Nq is not a multiple of BLOCK_N",
     [("stop = tl.minimum((last_visible + BLOCK_N - 1) // BLOCK_N * BLOCK_N, N_KEYS)",
       "stop = tl.minimum(last_visible // BLOCK_N * BLOCK_N, N_KEYS)")]),
    ("mutant_window_skip_rounds_up",
     "a window's first key block is the tile's first visible key rounded UP to a key block, so "
     "the block holding it is skipped: wrong when that key is not the first of its block",
     [("first = tl.maximum(start_m + LEFT_SHIFT, 0) // BLOCK_N * BLOCK_N",
       "first = (tl.maximum(start_m + LEFT_SHIFT, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N")]),
)
# Kernel bugs that may read rows past Nk (more than the inputs' guard holds for wide key blocks).
_READS_PAST_NK = {"mutant_v_load_unmasked", "mutant_maskfree_ragged_tail",
                  "mutant_diagonal_bounds_block_m_lt_n"}


# -- launch bugs: (name, what is planted, alter(grid, args) -> (grid, args)) ----------------------
def _grid_floor(grid, args):
    def floored(meta):
        return (args["N_QUERIES"] // meta["BLOCK_M"],) + tuple(grid(meta))[1:]
    return floored, args


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
        kernel = mutate(fa2_fwd_kernel, edits, name=name, helpers=(_attend_key_blocks,))
        built.append(_implementation(name, description, kernel,
                                     pad_lse=name == "mutant_lse_store_unmasked",
                                     pad_kv=name in _READS_PAST_NK))
    for name, description, alter in LAUNCH_BUGS:
        built.append(_implementation(name, description, _AlteredLaunch(alter)))
    return tuple(built)


MUTANTS = _build()


def combined(name: str, *bugs: str) -> Implementation:
    """triton_fa2's forward with several kernel bugs of KERNEL_BUGS planted at once (by name): a
    compiled kernel holding independent causes, as the one a campaign must report one row each."""
    chosen = {n: (d, e) for n, d, e in KERNEL_BUGS if n in bugs}
    missing = sorted(set(bugs) - set(chosen))
    if missing:
        raise ValueError(f"{name}: unknown kernel bugs {missing}")
    edits = [edit for bug in bugs for edit in chosen[bug][1]]
    kernel = mutate(fa2_fwd_kernel, edits, name=name, helpers=(_attend_key_blocks,))
    return _implementation(name, "; ".join(chosen[bug][0] for bug in bugs), kernel)
