"""Paged KV caches: a case's dense k, v laid out in blocks, for kernels declaring `paged_kv`.

The form of vLLM and FlashAttention's `flash_attn_with_kvcache`: k_cache and v_cache are
(num_blocks, block_size, Hkv, D), an int32 `block_table` (B, max_blocks) names the physical block
holding batch b's logical block i, and int32 `cache_seqlens` (B,) each sequence's length (here Nk
for every b). The physical order is a shuffle fixed by the case's data seed, never the logical
order, so a kernel that reads logical block i of sequence b at physical index b * max_blocks + i
gets other keys; spare blocks no table entry names, and the last block's slots past Nk, hold NaN,
so a read of an unmapped block or past a sequence's end shows in the output. Built from the dense
tensors with differentiable copies: gradients by autograd reach k and v through the pages. The
caches are copies, so the judge's guards around k and v do not reach a paged kernel: its reads past
the pages show through the NaN alone, and a write into a cache goes unseen.
"""
from __future__ import annotations

import dataclasses

import torch

from fuzzattn.contract.case import AttentionCase

_SHUFFLE_SALT = 0x9A6ED        # keeps the shuffle apart from the case's other seeded draws


@dataclasses.dataclass(frozen=True)
class PagedKV:
    k_cache: torch.Tensor       # (num_blocks, block_size, Hkv, D), k's dtype and device
    v_cache: torch.Tensor
    block_table: torch.Tensor   # (B, max_blocks) int32
    cache_seqlens: torch.Tensor  # (B,) int32


def blocks_per_sequence(case: AttentionCase) -> int:
    return -(-case.seq_k // case.paged_kv)


def page(k: torch.Tensor, v: torch.Tensor, case: AttentionCase) -> PagedKV:
    """k and v (B, Hkv, Nk, D) in `case.paged_kv`-row blocks, in a shuffled physical order, with
    half as many spare blocks again (at least one), spares and tails NaN."""
    size, per_seq = case.paged_kv, blocks_per_sequence(case)
    used = case.batch * per_seq
    physical = used + max(1, used // 2)
    shuffle = torch.Generator().manual_seed(case.data_seed ^ _SHUFFLE_SALT)
    order = torch.randperm(physical, generator=shuffle)
    if torch.equal(order[:used], torch.arange(used)):
        # Never the logical order itself, which would hide a kernel ignoring the table: rolled,
        # the first block comes from the spares.
        order = order.roll(1)
    order = order.to(k.device)
    caches = []
    for t in (k, v):
        rows = t.transpose(1, 2)                                     # (B, Nk, Hkv, D)
        tail = rows.new_full((case.batch, per_seq * size - case.seq_k) + rows.shape[2:], torch.nan)
        blocks = torch.cat([rows, tail], dim=1).reshape((used, size) + rows.shape[2:])
        poisoned = rows.new_full((physical, size) + rows.shape[2:], torch.nan)
        caches.append(poisoned.index_copy(0, order[:used], blocks))
    table = order[:used].view(case.batch, per_seq).to(torch.int32)
    lengths = torch.full((case.batch,), case.seq_k, dtype=torch.int32, device=k.device)
    return PagedKV(caches[0], caches[1], table, lengths)
