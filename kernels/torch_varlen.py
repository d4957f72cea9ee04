"""Packed ragged batches by a loop over the sequences: the reference varlen implementation.

flash_attn_varlen_func's convention (fuzzattn/contract/varlen.py): q `(total_q, Hq, D)`, k and v
`(total_k, Hkv, D)`, int32 `cu_seqlens_q/k`. Each sequence is cut out of the packed tensors by
its offsets and handed, as a batch of one, to the tiled forward of kernels/torch_tiled.py, whose
causal mask and window are then aligned to that sequence's own lengths; its answer is written
into its rows of the packed out and lse. out and lse come from torch.empty, so a sequence the
loop misses leaves its rows unwritten.
"""
from __future__ import annotations

import dataclasses

import torch

from fuzzattn.contract import Implementation, refuse
from fuzzattn.contract.varlen import check_packed, dense, packed

from . import torch_tiled
from .torch_tiled import CAPS as TILED_CAPS, torch_tiled_forward

# ALiBi and paged KV are per dense batch row (AttentionCase refuses them with a packed batch).
CAPS = dataclasses.replace(TILED_CAPS, varlen=True, alibi=False, paged_kv=False)


def torch_varlen_forward(q, k, v, *, causal, scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, window=(-1, -1), softcap=0.0):
    """(out (total_q, Hq, D) in q's dtype, lse (Hq, total_q) float32), one sequence at a time."""
    cu_q, cu_k = check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              refuse)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    for b in range(len(cu_q) - 1):
        q0, q1 = cu_q[b], cu_q[b + 1]
        k0, k1 = cu_k[b], cu_k[b + 1]
        o, l = torch_tiled_forward(dense(q[q0:q1]), dense(k[k0:k1]), dense(v[k0:k1]),
                                   causal=causal, scale=scale, window=window, softcap=softcap)
        out[q0:q1] = packed(o)
        lse[:, q0:q1] = l[0]
    return out, lse


IMPL = Implementation(
    name="torch_tiled_varlen",
    fn=torch_varlen_forward,
    caps=CAPS,
    description="Packed ragged batches (flash_attn_varlen_func's call): the tiled PyTorch "
                "forward run on each sequence alone, written into the packed out and lse.",
    sources=(__file__, torch_tiled.__file__),
)
