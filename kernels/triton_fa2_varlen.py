"""Packed ragged batches in the Triton FlashAttention-2 forward: flash_attn_varlen_func's call.

The dense kernel of kernels/triton_fa2.py with VARLEN set: program (tile, head, b) reads sequence
b's offsets from cu_seqlens_q/k on the device, moves its base pointers to the sequence's first
rows and takes the sequence's own lengths, so causal masks and windows are aligned per sequence
(sequence_edges in kernels/triton_fa2_variants.py). The grid spans max_seqlen_q rows; a tile past a
shorter sequence's end loads no key and stores nothing. The packed (total, H, D) tensors are
the kernel's (B, H, N, D) addressing with a batch stride of 0 and the packed dim's row stride,
so every layout the dense kernel takes (strided, broadcast heads) is taken packed too.

The backward runs the dense backward kernels (kernels/triton_fa2_backward.py) on each sequence's
views: packing needs no new backward kernel, only a loop, and a sequence with no query or no
key has no gradient to give (zeros).
"""
from __future__ import annotations

import dataclasses

import torch

from fuzzattn.contract import Implementation, refuse
from fuzzattn.contract.varlen import check_packed, dense, packed
from fuzzattn.kernels import triton_fa2, triton_fa2_variants as variants
from fuzzattn.kernels.triton_fa2 import block_d, checked_call, fa2_fwd_kernel
from fuzzattn.kernels.triton_fa2_backward import triton_fa2_backward
from fuzzattn.kernels.triton_fa2_launch import launch, output_buffer

# Sequences of length 0 are taken: their tiles store nothing, and a sequence with no key ends as
# out 0 and lse -inf on every row, as the dense kernel's rows that see no key.
CAPS = dataclasses.replace(triton_fa2.CAPS, varlen=True, zero_length=True)

# An edge the band does not have, as a per-sequence shift: larger than any packed length.
NO_EDGE = 1 << 30


def triton_fa2_varlen_forward(q, k, v, *, causal, scale, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q, max_seqlen_k, window=(-1, -1), softcap=0.0,
                              out=None, lse=None, config=None, kernel=None):
    """(out (total_q, Hq, D) in q's dtype, lse (Hq, total_q) float32) of packed sequences.

    q (total_q, Hq, D); k, v (total_k, Hkv, D), any strides; int32 cu_seqlens_q/k (B+1 offsets
    from 0) on q's device; max_seqlen_q/k at least the longest lengths. causal, window, softcap,
    config and kernel as triton_fa2_forward's."""
    cu_q, _ = check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, refuse)
    for name, offsets in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if offsets.device != q.device:
            refuse(f"{name}.device", str(offsets.device), str(q.device))
    causal, scale, window, softcap, config = checked_call(
        CAPS, dense(q), dense(k), dense(v), causal, scale, window, softcap, config)
    total_q, heads, head_dim = q.shape
    out = output_buffer("out", out, q.shape, q.dtype, q.device)
    lse = output_buffer("lse", lse, (heads, total_q), torch.float32, q.device)
    if max_seqlen_q == 0:
        return out, lse                     # no query row anywhere: nothing to launch
    top, upper_diagonal, lower_diagonal = variants.sequence_edges(causal, window)

    def rows(t):                            # (total, H, D) as (B, H, N, D): batch stride 0
        return 0, t.stride(1), t.stride(0), t.stride(2)

    args = (q, k, v, out, lse, *rows(q), *rows(k), *rows(v), *rows(out),
            0, lse.stride(0), lse.stride(1),
            max_seqlen_q, max_seqlen_k, head_dim, heads // k.shape[1],
            0, 0,                           # CAUSAL_SHIFT, LEFT_SHIFT: per sequence, in the kernel
            float(scale), softcap, cu_seqlens_q, cu_seqlens_k,
            NO_EDGE if top is None else top,
            NO_EDGE if upper_diagonal is None else upper_diagonal,
            0 if lower_diagonal is None else lower_diagonal)
    meta = dict(BLOCK_D=block_d(head_dim), IS_CAUSAL=top is not None or upper_diagonal is not None,
                HAS_LEFT=lower_diagonal is not None, SOFTCAP=softcap > 0, VARLEN=True)
    launch(kernel or fa2_fwd_kernel, (max_seqlen_q, heads, len(cu_q) - 1), args, meta, config)
    return out, lse


def triton_fa2_varlen_backward(q, k, v, out, lse, dout, *, causal, scale, cu_seqlens_q,
                               cu_seqlens_k, max_seqlen_q, max_seqlen_k, window=(-1, -1),
                               softcap=0.0, config=None):
    """(dq, dk, dv) of packed sequences, each packed like its input: the dense backward on each
    sequence's views (lse (Hq, total_q) as the forward returns it)."""
    cu_q, cu_k = check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              refuse)
    grads = tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    for q0, q1, k0, k1 in zip(cu_q, cu_q[1:], cu_k, cu_k[1:]):
        if q0 == q1 or k0 == k1:
            continue                        # no query or no key: nothing flows either way
        sequence = triton_fa2_backward(
            dense(q[q0:q1]), dense(k[k0:k1]), dense(v[k0:k1]), dense(out[q0:q1]),
            lse[:, q0:q1].unsqueeze(0), dense(dout[q0:q1]), causal=causal, scale=scale,
            window=window, softcap=softcap, config=config)
        for whole, grad, (a, b) in zip(grads, sequence, ((q0, q1), (k0, k1), (k0, k1))):
            whole[a:b] = packed(grad)
    return grads


IMPL = Implementation(
    name="triton_fa2_varlen",
    fn=triton_fa2_varlen_forward,
    caps=CAPS,
    description="triton_fa2's kernel on packed sequences (flash_attn_varlen_func's call): offsets "
                "read on the device, masks aligned per sequence; backward per sequence.",
    backend="triton",
    sources=(__file__, *triton_fa2.IMPL.sources),
    backward_fn=triton_fa2_varlen_backward,
)
