"""Seeded bugs in the PyTorch implementations (kernels/torch_tiled.py and kernels/sdpa.py).

Most are the real function with one source edit (see edit.py); the rest wrap the real function
and get one thing wrong around it (a layout reinterpretation, a GQA expansion, a flattening
order, noise between calls). Each declares exactly the capabilities of the implementation it
derives from, so the fuzzer draws the cases that can show its bug.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import torch

from fuzzattn.contract import Implementation
from fuzzattn.kernels import sdpa, torch_tiled
from fuzzattn.kernels.sdpa import sdpa_forward

from .edit import mutate

_HERE = str(Path(__file__).resolve())


def _implementation(name: str, description: str, real: Implementation, fn) -> Implementation:
    return Implementation(name=name, fn=fn, caps=real.caps, description=description,
                          mutant_of=real.name, backend=real.backend, sources=(_HERE,) + real.sources)


# -- helpers the edited sources call --------------------------------------------------------------
_STAGING: dict[tuple, torch.Tensor] = {}


def _staged_fp32(t: torch.Tensor) -> torch.Tensor:
    """An fp32 copy of t in a scratch buffer reused by shape: the planted bug is that two live
    tensors of the same shape get the same buffer."""
    key = (tuple(t.shape), t.device)
    if key not in _STAGING:
        _STAGING[key] = torch.empty(t.shape, dtype=torch.float32, device=t.device)
    return _STAGING[key].copy_(t)


# -- edits of torch_tiled_forward: (name, what is planted, edits) ----------------------------------
TILED_BUGS = (
    ("mutant_bottom_right_as_top_left",
     "bottom-right causal computed as top-left: the Nk - Nq diagonal offset is dropped",
     [("offset = seq_k - seq_q if causal == \"bottom_right\" else 0", "offset = 0")]),
    ("mutant_bottom_right_offset_sign",
     "bottom-right diagonal offset Nq - Nk instead of Nk - Nq",
     [("offset = seq_k - seq_q if", "offset = seq_q - seq_k if")]),
    ("mutant_tail_rows_unwritten",
     "loop covers only whole 16-row query tiles: the partial last tile of torch.empty out is never written",
     [("for q0 in range(0, seq_q, TILE):", "for q0 in range(0, seq_q - seq_q % TILE, TILE):")]),
    ("mutant_scales_q_in_place",
     "pre-scales each q tile in place (.float() is a no-op copy for fp32): the caller's q changes",
     [("q_i = q5[..., q0:q0 + TILE, :].float()", "q_i = q5[..., q0:q0 + TILE, :].float().mul_(scale)"),
      ("s = (q_i @ k_j.transpose(-1, -2)) * scale", "s = q_i @ k_j.transpose(-1, -2)")]),
    ("mutant_empty_rows_nan",
     "no safe max: rows with no visible key compute exp(-inf - -inf) = NaN",
     [("m_safe = torch.where(m_new == -math.inf, 0.0, m_new)", "m_safe = m_new")]),
    ("mutant_empty_rows_mean_v",
     "masked scores filled with the dtype's most negative finite value: rows with no visible key "
     "average all of V",
     [("s = s.masked_fill(~visible, -math.inf)", "s = s.masked_fill(~visible, torch.finfo(s.dtype).min)")]),
    ("mutant_sentinel_half_dtype_min",
     "masked scores and the running max start at half the input dtype's lowest value (fp16 "
     "-32752, bf16 and fp32 ~-1.7e38), rows whose max stays there taken as empty: right until "
     "real scores fall below it",
     [("s = s.masked_fill(~visible, -math.inf)",
       "s = s.masked_fill(~visible, torch.finfo(q.dtype).min / 2)"),
      ("m_i = torch.full(q_i.shape[:-1], -math.inf,",
       "m_i = torch.full(q_i.shape[:-1], torch.finfo(q.dtype).min / 2,"),
      ("empty = l_i == 0 ",
       "empty = m_i <= torch.finfo(q.dtype).min / 2; acc = acc.masked_fill(empty[..., None], 0.0) ")]),
    ("mutant_tiled_denominator_detached",
     "softmax denominator detached from autograd before the final division (as the running max "
     "may be): the forward is exact, but dq and dk miss the denominator's gradient",
     [("out[..., q0:q0 + TILE, :] = (acc / torch.where(empty, 1.0, l_i)[..., None]).to(q.dtype)",
       "out[..., q0:q0 + TILE, :] = (acc / torch.where(empty, 1.0, l_i.detach())[..., None]).to(q.dtype)")]),
    ("mutant_mqa_squeeze",
     "MQA path squeezes the size-1 kv-head dim, so k's batch dim broadcasts against q's heads",
     [("k5, v5 = k.unsqueeze(2), v.unsqueeze(2)",
       "k5, v5 = (k.squeeze(1), v.squeeze(1)) if kv_heads == 1 else (k.unsqueeze(2), v.unsqueeze(2))")]),
    # Precision bugs. Each stays within the max rule's bound on most cases of its own dtype (the
    # errors are a few roundings of the input dtype, spread over every element), so they are the
    # targets of the error-statistics check (fuzzattn/judging/error_statistics.py). The accumulator
    # ones plant "the accumulator kept in the input's dtype", a bug only for that dtype: an fp32
    # kernel with an fp32 accumulator is correct, so fp32 cases must not give them away.
    ("mutant_acc_bf16",
     "bf16 inputs: the output accumulator is rounded to bf16 after every key block",
     [("            acc = alpha[..., None] * acc + p @ v_j\n",
       "            acc = alpha[..., None] * acc + p @ v_j\n"
       "            if q.dtype == torch.bfloat16:\n"
       "                acc = acc.to(torch.bfloat16).float()\n")]),
    ("mutant_acc_fp16",
     "fp16 inputs: the output accumulator is rounded to fp16 after every key block",
     [("            acc = alpha[..., None] * acc + p @ v_j\n",
       "            acc = alpha[..., None] * acc + p @ v_j\n"
       "            if q.dtype == torch.float16:\n"
       "                acc = acc.to(torch.float16).float()\n")]),
    ("mutant_pv_low_precision",
     "P @ V multiplied in the input dtype (a low-precision product and accumulation) instead of fp32",
     [("acc = alpha[..., None] * acc + p @ v_j",
       "acc = alpha[..., None] * acc + (p.to(q.dtype) @ v_j.to(q.dtype)).float()")]),
    ("mutant_running_max_bf16",
     "the running max is stored in bf16 between key blocks, while P, l and acc used the fp32 one",
     [("            m_i = m_new\n", "            m_i = m_new.to(torch.bfloat16).float()\n")]),
    # Shape-family bugs: each shows only on the (Nq, Nk) pairs of one family (strategies/lengths.py).
    ("mutant_decode_ignores_causal",
     "decode (Nq = 1) skips the causal mask: with top-left alignment the one query sees every key",
     [("if causal != \"none\":", "if causal != \"none\" and seq_q != 1:")]),
    # Variant bugs: each shows only on cases with a window, a softcap, ALiBi or a paged cache.
    ("mutant_window_edge_off_by_one",
     "window's left edge exclusive: query i loses key i + Nk - Nq - left, the window's first",
     [("(cols >= rows[:, None] + diagonal - left)", "(cols > rows[:, None] + diagonal - left)")]),
    ("mutant_window_top_left",
     "window aligned top-left (diagonal j = i) instead of bottom-right (j = i + Nk - Nq)",
     [("    diagonal = seq_k - seq_q\n", "    diagonal = 0\n")]),
    ("mutant_softcap_after_mask",
     "softcap applied after the mask: hidden keys score -softcap, not -inf, and get weight",
     [("            if softcap:\n                s = softcap * torch.tanh(s / softcap)"
       "       # before the mask: hidden stays -inf\n", ""),
      ("            m_new = torch.maximum(m_i, s.amax(dim=-1))\n",
       "            if softcap:\n                s = softcap * torch.tanh(s / softcap)\n"
       "            m_new = torch.maximum(m_i, s.amax(dim=-1))\n")]),
    ("mutant_softcap_unscaled",
     "softcap's tanh applied to the unscaled q.k: softcap * tanh(q.k / softcap)",
     [("s = softcap * torch.tanh(s / softcap)", "s = softcap * torch.tanh(s / scale / softcap)")]),
    ("mutant_alibi_wrong_sign",
     "ALiBi's bias added with the wrong sign: far keys gain weight instead of losing it",
     [("s = s - alibi * (rows", "s = s + alibi * (rows")]),
    ("mutant_alibi_top_left",
     "ALiBi's distance measured from the top-left diagonal, |i - j|, without the Nk - Nq offset",
     [("(rows[:, None] + (seq_k - seq_q) - keys[None, :])", "(rows[:, None] - keys[None, :])")]),
    ("mutant_paged_logical_blocks",
     "paged KV cache read by logical block (b * max_blocks + i), ignoring the block table",
     [("pages = block_table.long()",
       "pages = torch.arange(block_table.numel(), device=q.device).view(block_table.shape)")]),
    ("mutant_chunk_wrong_alignment",
     "chunks (1 < Nq < Nk) aligned to the wrong end of the keys: top-left and bottom-right swapped",
     [("offset = seq_k - seq_q if causal == \"bottom_right\" else 0",
       "offset = seq_k - seq_q if (causal == \"bottom_right\") != (1 < seq_q < seq_k) else 0")]),
)

# -- edits of sdpa_forward -------------------------------------------------------------------------
SDPA_BUGS = (
    ("mutant_staging_buffer_aliasing",
     "fp32 staging buffers for the lse pooled by shape: q's and k's alias when shapes match",
     [("q5 = q.unflatten(1, (kv_heads, heads // kv_heads)).float()",
       "q5 = _staged_fp32(q.unflatten(1, (kv_heads, heads // kv_heads)))"),
      ("scores = (q5 @ k.unsqueeze(2).float().transpose(-1, -2)) * scale",
       "scores = (q5 @ _staged_fp32(k.unsqueeze(2)).transpose(-1, -2)) * scale")]),
    ("mutant_lse_unmasked",
     "lse computed from the unmasked scores: causally hidden keys still count in it",
     [("    if visible is not None:\n        scores = scores.masked_fill(~visible, -math.inf)\n", "")]),
)


def _edited(real: Implementation, specs, extra_globals=None):
    return tuple(_implementation(name, description, real,
                                 mutate(real.fn, edits, name=name, extra_globals=extra_globals))
                 for name, description, edits in specs)


# -- wrappers around sdpa_forward -------------------------------------------------------------------
def _packed_view(t: torch.Tensor) -> torch.Tensor:
    """t's storage read from its offset with contiguous strides, as `set_(storage, offset, shape)`
    does: right only when t was contiguous."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage(), t.storage_offset(), t.shape)


def assumes_contiguous(q, k, v, *, causal, scale):
    return sdpa_forward(_packed_view(q), _packed_view(k), _packed_view(v), causal=causal, scale=scale)


def gqa_repeat(q, k, v, *, causal, scale):
    group = q.shape[1] // k.shape[1]
    if group > 1:   # tiles the kv heads (h -> h % Hkv) where repeat_interleave groups them (h // G)
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    return sdpa_forward(q, k, v, causal=causal, scale=scale)


def batch_head_mixup(q, k, v, *, causal, scale):
    batch, heads, seq_q, dim = q.shape
    group = heads // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    # q is flattened head-major, k and v batch-major: (b, h) meets the keys of another pair.
    qf = q.transpose(0, 1).reshape(1, heads * batch, seq_q, dim)
    kf, vf = (t.reshape(1, batch * heads, t.shape[2], dim) for t in (k, v))
    out, lse = sdpa_forward(qf, kf, vf, causal=causal, scale=scale)
    return (out.reshape(heads, batch, seq_q, dim).transpose(0, 1),
            lse.reshape(heads, batch, seq_q).transpose(0, 1))


def noisy_out(q, k, v, *, causal, scale):
    out, lse = sdpa_forward(q, k, v, causal=causal, scale=scale)
    # Every nonzero normal element moves by 1-2 ulps of fp32, up on one call and down on the
    # next (like a reduction whose order depends on thread scheduling): values stay within
    # tolerance, but two runs in a row always differ bitwise. Noise drawn afresh could round
    # away on a small output and hide the bug from one judgement but not the next.
    sign = 1.0 if next(_NOISY_CALLS) % 2 else -1.0
    return (out.double() * (1.0 + sign * 2.0 ** -23)).to(out.dtype), lse


_NOISY_CALLS = itertools.count()


WRAPPER_BUGS = (
    ("mutant_assumes_contiguous", "reinterprets q, k, v's storage with contiguous strides "
     "(Tensor.set_(storage, offset, shape)), ignoring their real strides", assumes_contiguous),
    ("mutant_gqa_repeat", "GQA expands k/v with repeat (head h reads kv head h % Hkv) instead of "
     "repeat_interleave (h // group)", gqa_repeat),
    ("mutant_batch_head_mixup", "q flattened head-major but k, v batch-major into (B*H, N, D): "
     "pairs (b, h) with another pair's keys", batch_head_mixup),
    ("mutant_nondeterministic", "moves out by ~1 ulp, up and down on alternate calls, as a "
     "scheduling-dependent reduction order would", noisy_out),
)

MUTANTS = (
    _edited(torch_tiled.IMPL, TILED_BUGS)
    + _edited(sdpa.IMPL, SDPA_BUGS, {"_staged_fp32": _staged_fp32})
    + tuple(_implementation(name, description, sdpa.IMPL, fn) for name, description, fn in WRAPPER_BUGS)
)
