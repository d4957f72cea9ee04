"""FlexAttention (`torch.nn.attention.flex_attention`) compiled with `torch.compile`, under test.

The call is what a user of FlexAttention writes: `torch.compile(flex_attention)` with a block
mask from `create_block_mask` for causal attention and none otherwise, `enable_gqa=True` when
Hkv < Hq, the case's scale, and the lse through `return_aux=AuxRequest(lse=True)` (flex converts
its base-2 statistic to natural log before returning it, the contract's unit).

Causal: key j is visible to query i iff j - i <= offset, with offset 0 for top-left and Nk - Nq
for bottom-right. A sliding window (left, right) is the band Nk - Nq - left <= j - i <=
Nk - Nq + right in the same mask_mod (flex leaves the bottom-right shift to its user), a
softcap is a score_mod, c * tanh(score / c): flex applies it to the scaled score before the mask,
and ALiBi is a score_mod subtracting slope_h * |i + Nk - Nq - j| after the cap (_alibi).
Rows with no visible key are left to flex: its answer for them (out 0, lse -inf) is judged, not
patched.

Compilation. `dynamic=False`: every shape, stride pattern, dtype, scale and mask presence
compiles once (dynamo guards on the scale's value: `scale == 0.3`; with automatic dynamic shapes
every new length still recompiled, measured on the CPU); the two causal alignments of a shape
share one compile (`_visible`). Campaigns therefore draw shapes from a palette
(`Capabilities.compiles_per_shape`). `fullgraph=True` and raised recompile limits (with
`fail_on_recompile_limit_hit`) make a graph break or the limit an error, never a silent run of
the eager fallback, which would be judged in flex's place.

On the CPU, inductor's C++ template computes no lse and no gradients ("torch.compile on CPU only
supports inference and `return_lse` is not supported yet"), so there flex declares out only and
no backward; on CUDA both.
"""
from __future__ import annotations

import functools

import torch

from fuzzattn.contract import Capabilities, Implementation, KnownDefect
from fuzzattn.triton_interpreter.fence import release

# flex_attention came in torch 2.5, return_aux in 2.9. Its module is imported on first use: it
# pulls in torch._dynamo (~2 s, docs/CALIBRATION.md#compiles), which every process that imports
# the registry (each CLI command, worker and xdist worker) would otherwise pay, flex judged or not.
UNAVAILABLE = (None if release(torch.__version__) >= (2, 9) else
               f"torch {torch.__version__} has no FlexAttention with return_aux (torch >= 2.9)")


def _api():
    """torch.nn.attention.flex_attention, imported on first use."""
    from torch.nn.attention import flex_attention as api
    return api

ON_CUDA = torch.cuda.is_available()
RECOMPILE_LIMIT = 1 << 20           # per code object and in all: far above any campaign's variants
PALETTE_SHAPES = 4                  # shapes per campaign: each compiles twice per dtype at most

# Compiled lazily: the first call compiles anyway, and importing the registry stays cheap.
_compiled = None


def _flex():
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(_api().flex_attention, dynamic=False, fullgraph=True)
    return _compiled


def _limits():
    """Raised recompile limits for the call, and an error (not eager) should one be hit. The
    names changed over releases (cache_size_limit became recompile_limit): set those that exist."""
    import torch._dynamo
    config = torch._dynamo.config
    wanted = {name: RECOMPILE_LIMIT for name in ("recompile_limit", "cache_size_limit",
                                                 "accumulated_recompile_limit",
                                                 "accumulated_cache_size_limit")}
    wanted.update(fail_on_recompile_limit_hit=True, fail_on_cache_limit_hit=True)
    return config.patch(**{name: value for name, value in wanted.items() if hasattr(config, name)})


# The sparse block of a block mask (create_block_mask's default, and flex's own when none is given).
SPARSE_BLOCK = 128


def decoding(case) -> bool:
    """Flex decoding lowers calls with Nq < 128 and a power-of-two GQA group."""
    group = case.heads // case.kv_heads
    return case.seq_q < SPARSE_BLOCK and group > 1 and group & (group - 1) == 0


def _decoding_with_a_mask(case) -> bool:
    """Flex decoding, and a block mask: causal calls carry one."""
    return case.causal != "none" and decoding(case)


def rows_past_the_sparse_block(case) -> bool:
    """Flex decoding stacks the G query heads of a KV head into one tile of
    next_power_of_2(Nq * G) rows, and drops every configuration whose tile does not divide the
    block mask's sparse block: past 128 rows none is left (regressions/ab18a9f314cb.json). Only
    under a block mask: without one (non-causal) flex's own block spans the whole sequence, and
    the same shapes compile (docs/CALIBRATION.md#compiles)."""
    return case.seq_q * (case.heads // case.kv_heads) > SPARSE_BLOCK


def _decoding_rows_past_the_sparse_block(case) -> bool:
    """The NoValidChoicesError class: decoding, causal (a block mask), rows past 128."""
    return _decoding_with_a_mask(case) and rows_past_the_sparse_block(case)


def _fp32_strided_last_dim_q_and_k(case) -> bool:
    """q and k both with stride 2 in the last dimension, fp32: the one class measured
    (regressions/208e505db4d8.json; v's layout did not matter). Whether one strided input is
    enough, and other dtypes, is not established. `unsafe`: two runs of the case differ, so flex
    reads memory it does not own there."""
    return case.dtype == "float32" and case.layout[0] == case.layout[1] == "last_dim_strided"


def _decoding_fp32_head_dim_80(case) -> bool:
    """Flex decoding with a block mask, head dim 80, fp32: the one case measured
    (regressions/a6513705ec89.json, B=4 H=16/4 Nq=22 Nk=95) gave no result from its forward call
    within minutes. The predicate is that case's code path, head dim and dtype; which of them
    matter is not established."""
    return _decoding_with_a_mask(case) and case.head_dim == 80 and case.dtype == "float32"


KNOWN_DEFECTS = (
    KnownDefect("compiled forward raises NoValidChoicesError: flex decoding (Nq < 128) with a "
                "block mask, a power-of-two GQA group and Nq * group > 128", "cuda",
                _decoding_rows_past_the_sparse_block, "ab18a9f314cb.json", check="crash"),
    KnownDefect("compiled forward: heads past the first wrong and nondeterministic, fp32 q and k "
                "with a strided last dimension", "cuda", _fp32_strided_last_dim_q_and_k,
                "208e505db4d8.json", check="out", unsafe=True),
    # A hang is judged in a worker only; a replay of its file is not run (campaigns/file_replay.py).
    KnownDefect("compiled forward gives no result within minutes: flex decoding with a block mask, "
                "head dim 80, fp32", "cuda", _decoding_fp32_head_dim_80, "a6513705ec89.json",
                check="hang"),
)

CAPS = Capabilities(
    dtypes={"float32", "bfloat16", "float16"},
    # CUDA: flex's Triton template refuses E < 16 ("NYI: embedding dimension of the query, key,
    # and value must be at least 16"); 256 is left out until measured on a GPU. The CPU template
    # runs any head dim.
    head_dims={16, 24, 32, 40, 48, 64, 72, 80, 96, 128} if ON_CUDA else None,
    max_head_dim=256,
    causal=("top_left", "bottom_right"),
    gqa=True,
    strides="any",
    zero_length=False,               # a block mask needs Nq, Nk >= 1
    window=True,                     # a band mask_mod (_band)
    softcap=True,                    # a score_mod (_softcap)
    alibi=True,                      # a score_mod (_alibi)
    returns_lse=ON_CUDA,
    backward=ON_CUDA,                # autograd through the compiled flex (its own backward kernel)
    deterministic_backward=False,    # not measured on a GPU yet: reruns are not required to match
    fp32_matmul="ieee",              # torch's default fp32 matmul precision, which flex follows
    deterministic=True,
    compiles_per_shape=True,
    palette_shapes=PALETTE_SHAPES,
    known_defects=KNOWN_DEFECTS,      # CUDA only
)


@functools.lru_cache(maxsize=None)
def _visible(offset: int, device: str):
    """The mask_mod of one diagonal offset. The offset is a captured 0-d tensor, not a Python
    constant: dynamo lifts it as an input guarded on its shape and dtype only, so both causal
    alignments of a shape share one compile (measured: the second offset ran in 0.06 s on the
    CPU, where a constant offset recompiled)."""
    limit = torch.tensor(offset, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx - q_idx <= limit
    return mask_mod


@functools.lru_cache(maxsize=256)
def _band(lowest: int, highest: int | None, device: str):
    """The mask_mod keeping lowest <= kv_idx - q_idx (<= highest unless None), the limits
    captured 0-d tensors as in _visible: windows of one shape share a compile."""
    low = torch.tensor(lowest, device=device)
    if highest is None:
        def mask_mod(b, h, q_idx, kv_idx):
            return kv_idx - q_idx >= low
        return mask_mod
    high = torch.tensor(highest, device=device)

    def banded(b, h, q_idx, kv_idx):
        return (kv_idx - q_idx >= low) & (kv_idx - q_idx <= high)
    return banded


@functools.lru_cache(maxsize=256)
def _softcap(cap: float, device: str):
    """The score_mod c * tanh(score / c) (score already scaled), c a captured 0-d tensor."""
    c = torch.tensor(cap, dtype=torch.float32, device=device)

    def score_mod(score, b, h, q_idx, kv_idx):
        return c * torch.tanh(score / c)
    return score_mod


@functools.lru_cache(maxsize=256)
def _alibi(slopes: tuple[float, ...], shift: int, softcap: float, device: str):
    """The score_mod score - slope_h * |q_idx + shift - kv_idx| (shift = Nk - Nq: the distance
    from the bottom-right diagonal), applied to the softcapped score when a cap is given
    (FlashAttention's order); the slopes and the shift captured tensors, as in _visible."""
    slope = torch.tensor(slopes, dtype=torch.float32, device=device)
    diagonal = torch.tensor(shift, device=device)
    cap = _softcap(softcap, device) if softcap else None

    def score_mod(score, b, h, q_idx, kv_idx):
        if cap is not None:
            score = cap(score, b, h, q_idx, kv_idx)
        return score - slope[h] * (q_idx + diagonal - kv_idx).abs()
    return score_mod


@functools.lru_cache(maxsize=256)
def _block_mask(seq_q: int, seq_k: int, causal: str, window: tuple[int, int], device: str):
    """The block mask of one causal alignment, window and shape (None when every key is
    visible), built once. Causal's diagonal and the window's right edge both bound j - i from
    above: the nearer one is the band's top."""
    left, right = window
    shift = seq_k - seq_q                 # the window is bottom-right aligned
    tops = ([0 if causal == "top_left" else shift] if causal != "none" else []) + (
        [shift + right] if right >= 0 else [])
    top = min(tops) if tops else None
    if left < 0 and top is None:
        return None
    mask_mod = _visible(top, device) if left < 0 else _band(shift - left, top, device)
    return _api().create_block_mask(mask_mod, None, None, seq_q, seq_k, device=device)


def flex_forward(q, k, v, *, causal, scale, window=(-1, -1), softcap=0.0, alibi_slopes=None):
    """(out, lse) on CUDA, out on the CPU, from the compiled flex_attention."""
    causal, scale = CAPS.check_inputs(q, k, v, causal=causal, scale=scale)
    window, softcap = CAPS.check_variants(window=window, softcap=softcap)
    alibi_slopes = CAPS.check_alibi(alibi_slopes, q)
    block_mask = _block_mask(q.shape[2], k.shape[2], causal, window, str(q.device))
    kwargs = dict(block_mask=block_mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    if alibi_slopes is not None:
        kwargs["score_mod"] = _alibi(tuple(alibi_slopes.tolist()), k.shape[2] - q.shape[2],
                                     softcap, str(q.device))
    elif softcap:
        kwargs["score_mod"] = _softcap(softcap, str(q.device))
    return _call(q, k, v, kwargs)


def _call(q, k, v, kwargs):
    """The compiled flex on (B, H, N, D) tensors: (out, lse) where lse is declared, else out."""
    with _limits():
        if not CAPS.returns_lse:
            return _flex()(q, k, v, **kwargs)
        out, aux = _flex()(q, k, v, return_aux=_api().AuxRequest(lse=True), **kwargs)
    return out, aux.lse.float()


# On the CPU, torch 2.13's compiled flex (inductor's C++ template) is wrong for some lengths where
# eager flex_attention is right: Nq=16, Nk=40, D=16, fp32, no mask: max error 0.53; Nq=8, Nk=40:
# NaN; and a rerun of such a case can raise dynamo's "Attempted to call function marked as
# skipped". It failed 15 of the regression files replayed on it. The template is generated for
# the host's vector ISA, and on another CPU (AVX-512) the same lengths come out right, so the
# defect is not on every CPU. Flex is registered on CUDA only; on the CPU `IMPL` stays importable
# for direct use, and tests/kernels/test_flex.py measures the defect where it runs (skipped, saying so,
# on a CPU that computes these lengths right).
CPU_DEFECT = (None if ON_CUDA else
              f"torch {torch.__version__}: compiled CPU flex_attention gives wrong outputs or NaN "
              "for some lengths (Nq=16 Nk=40 D=16 fp32, no mask) where eager flex is right")

IMPL = None if UNAVAILABLE else Implementation(
    name="flex",
    fn=flex_forward,
    caps=CAPS,
    description="torch.compile(flex_attention): block masks for both causal alignments and "
                "windows, softcap and ALiBi score_mods, enable_gqa, lse from return_aux (CUDA), "
                "static shapes.",
    sources=(__file__,),
)

# What the registry lists: flex where its compiled path can be judged (CPU_DEFECT says why not).
REGISTERED = IMPL if CPU_DEFECT is None else None
