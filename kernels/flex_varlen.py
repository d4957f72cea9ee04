"""Packed ragged batches through FlexAttention: one batch-1 call under a document mask.

flash_attn_varlen_func's convention (fuzzattn/contract/varlen.py): q `(total_q, Hq, D)`, k and v
`(total_k, Hkv, D)`, int32 `cu_seqlens_q/k`, out packed like q and lse `(Hq, total_q)`. Flex
takes the packed tensors as one (1, H, total, D) problem, the way attention-gym packs documents:
a mask_mod keeps key j for query i only when both lie in the same sequence, and applies causality
and the window to their positions within it, aligned to that sequence's own lengths (query i' of
a sequence of lengths Lq, Lk keeps key j' iff j' - i' <= 0 top-left, <= Lk - Lq bottom-right, and
Lk - Lq - left <= j' - i' <= Lk - Lq + right). Flex's lse is (1, Hq, total_q): its row is the
contract's packed lse as it stands, no transpose.

Each packed position's sequence, offset within it and its sequence's Lk - Lq are captured int32
tensors of the totals' lengths, built per call from the offsets; the block mask is built per call
too (the sequences change with each case). Compilation is kernels/flex.py's: static shapes, a
compile per total length. Not registered (kernels/__init__.py): `--impl
fuzzattn.kernels.flex_varlen:IMPL` fuzzes it.
"""
from __future__ import annotations

import dataclasses

import torch

from fuzzattn.contract import Implementation, refuse
from fuzzattn.contract.known_defects import KnownDefect
from fuzzattn.contract.varlen import check_packed, dense
from fuzzattn.kernels import flex


def _packed_decoding_rows_past_the_sparse_block(case) -> bool:
    """flex's NoValidChoicesError class (kernels/flex.py) on the packed totals: the document
    mask is a block mask whatever the causal flag."""
    return flex.decoding(case) and flex.rows_past_the_sparse_block(case)


def _packed_decoding_fp32_head_dim_80(case) -> bool:
    """flex's hang class (kernels/flex.py) on the packed totals, met with B=1 H=16/4 Nq=17 D=80."""
    return flex.decoding(case) and case.head_dim == 80 and case.dtype == "float32"


# A hang is judged in a worker only; its file's replay is not run (campaigns/file_replay.py).
KNOWN_DEFECTS = (
    KnownDefect("compiled forward raises NoValidChoicesError: flex decoding of the packed totals "
                "(Nq < 128) under the document mask, a power-of-two GQA group, Nq * group > 128",
                "cuda", _packed_decoding_rows_past_the_sparse_block, "7140b2b50fb8.json",
                check="crash"),
    KnownDefect("compiled forward gives no result within minutes: flex decoding of the packed "
                "totals under the document mask, head dim 80, fp32", "cuda",
                _packed_decoding_fp32_head_dim_80, "e362236127c9.json", check="hang"),
)

# flex's declaration, packed: a sequence of length 0 is refused as flex's zero lengths are (a
# block mask needs keys), ALiBi and paged KV by AttentionCase with a packed batch. The CUDA known
# defects are flex's decoding classes: with a power-of-two GQA group, a packed call under 128
# query rows takes flex decoding under a block mask, causal or not.
CAPS = None if flex.UNAVAILABLE else dataclasses.replace(
    flex.CAPS, varlen=True, alibi=False, known_defects=KNOWN_DEFECTS)


def _positions(cu: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence index, offset within it) of each packed position, int32."""
    lengths = torch.tensor([b - a for a, b in zip(cu, cu[1:])], device=device)
    sequence = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    starts = torch.tensor(cu[:-1], device=device)
    offset = torch.arange(cu[-1], device=device) - starts[sequence]
    return sequence.int(), offset.int()


def document_mask(cu_q: list[int], cu_k: list[int], causal: str, window: tuple[int, int],
                  device):
    """The mask_mod keeping each sequence's own keys, causal and windowed within it."""
    left, right = window
    q_sequence, q_offset = _positions(cu_q, device)
    k_sequence, k_offset = _positions(cu_k, device)
    shifts = torch.tensor([(k1 - k0) - (q1 - q0) for q0, q1, k0, k1 in
                           zip(cu_q, cu_q[1:], cu_k, cu_k[1:])], dtype=torch.int32, device=device)
    q_shift = shifts[q_sequence.long()]                     # Lk - Lq of each query's sequence

    def mask_mod(b, h, q_idx, kv_idx):
        relative = k_offset[kv_idx] - q_offset[q_idx]       # j' - i'
        shift = q_shift[q_idx]
        kept = q_sequence[q_idx] == k_sequence[kv_idx]
        if causal == "top_left":
            kept = kept & (relative <= 0)
        elif causal == "bottom_right":
            kept = kept & (relative <= shift)
        if left >= 0:
            kept = kept & (relative >= shift - left)
        if right >= 0:
            kept = kept & (relative <= shift + right)
        return kept
    return mask_mod


def flex_varlen_forward(q, k, v, *, causal, scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, window=(-1, -1), softcap=0.0):
    """(out (total_q, Hq, D), lse (Hq, total_q) float32) on CUDA, out on the CPU."""
    cu_q, cu_k = check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              refuse)
    q4, k4, v4 = dense(q), dense(k), dense(v)
    causal, scale = CAPS.check_inputs(q4, k4, v4, causal=causal, scale=scale)
    window, softcap = CAPS.check_variants(window=window, softcap=softcap)
    lengths = [b - a for a, b in zip(cu_q, cu_q[1:])] + [b - a for a, b in zip(cu_k, cu_k[1:])]
    if 0 in lengths:
        refuse("sequence lengths", lengths, "every sequence's lengths >= 1 (a block mask needs keys)")
    device = str(q.device)
    block_mask = flex._api().create_block_mask(document_mask(cu_q, cu_k, causal, window, device),
                                               None, None, q.shape[0], k.shape[0], device=device)
    kwargs = dict(block_mask=block_mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    if softcap:
        kwargs["score_mod"] = flex._softcap(softcap, device)
    result = flex._call(q4, k4, v4, kwargs)
    if not isinstance(result, tuple):
        return result[0].transpose(0, 1)
    out, lse = result
    return out[0].transpose(0, 1), lse[0]


IMPL = None if flex.UNAVAILABLE else Implementation(
    name="flex_varlen",
    fn=flex_varlen_forward,
    caps=CAPS,
    description="torch.compile(flex_attention) on packed ragged batches (flash_attn_varlen_func's "
                "call): one batch-1 call under a document mask_mod, causal and windowed per "
                "sequence, a softcap score_mod, lse from return_aux (CUDA).",
    sources=(__file__, flex.__file__),
)
