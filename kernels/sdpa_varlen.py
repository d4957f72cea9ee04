"""Packed ragged batches through SDPA: a loop over the sequences, each its own SDPA call.

flash_attn_varlen_func's convention (fuzzattn/contract/varlen.py): q `(total_q, Hq, D)`, k and v
`(total_k, Hkv, D)`, int32 `cu_seqlens_q/k`, out packed like q and lse `(Hq, total_q)`. Each
sequence is cut out of the packed tensors by its offsets and run as a batch of one through
kernels/sdpa_window.py's `masked_sdpa`, so its causal mask and window are explicit and aligned to
its own lengths; its answer is written into its rows of out and lse. A sequence with no queries
writes nothing; one with no keys gives its rows out 0 and lse -inf (masked_sdpa's empty rows).
out and lse come from torch.empty, so a sequence the loop misses leaves its rows unwritten.
"""
from __future__ import annotations

import dataclasses

import torch

from fuzzattn.contract import Implementation, refuse
from fuzzattn.contract.varlen import check_packed, dense, packed
from fuzzattn.kernels import sdpa, sdpa_window
from fuzzattn.kernels.sdpa_defects import KNOWN_DEFECTS
from fuzzattn.kernels.sdpa_window import masked_sdpa

# sdpa_window's declaration, packed. ALiBi and paged KV are per dense batch row (AttentionCase
# refuses them with a packed batch). The CUDA known defects are those its GPU campaigns met and
# `fuzzattn explain` narrowed (kernels/sdpa_defects.py); it stays registered off CUDA while its
# fp16 campaigns there still find new ones (kernels/__init__.py).
CAPS = dataclasses.replace(sdpa_window.CAPS, varlen=True,
                           known_defects=KNOWN_DEFECTS["sdpa_varlen"])


def sdpa_varlen_forward(q, k, v, *, causal, scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, window=(-1, -1)):
    """(out (total_q, Hq, D) in q's dtype, lse (Hq, total_q) float32), one sequence at a time."""
    cu_q, cu_k = check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              refuse)
    causal, scale = CAPS.check_inputs(dense(q), dense(k), dense(v), causal=causal, scale=scale)
    window, _ = CAPS.check_variants(window=window, softcap=0.0)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    for q0, q1, k0, k1 in zip(cu_q, cu_q[1:], cu_k, cu_k[1:]):
        if q1 == q0:
            continue
        o, l = masked_sdpa(dense(q[q0:q1]), dense(k[k0:k1]), dense(v[k0:k1]), causal=causal,
                           scale=scale, window=window)
        out[q0:q1] = packed(o)
        lse[:, q0:q1] = l[0]
    return out, lse


IMPL = Implementation(
    name="sdpa_varlen",
    fn=sdpa_varlen_forward,
    caps=CAPS,
    description="Packed ragged batches (flash_attn_varlen_func's call): SDPA run on each "
                "sequence alone with its causal mask and window explicit, lse beside it in fp32.",
    sources=(__file__, sdpa_window.__file__, sdpa.__file__),
)
