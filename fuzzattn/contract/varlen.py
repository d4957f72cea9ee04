"""Packed ragged batches: FlashAttention-2's `flash_attn_varlen_func` calling convention.

A packed case (AttentionCase.seqlens_q / seqlens_k set) is B sequences laid end to end: q is
`(total_q, Hq, D)`, k and v `(total_k, Hkv, D)`; sequence b owns q rows
`cu_seqlens_q[b] .. cu_seqlens_q[b+1]` and k/v rows `cu_seqlens_k[b] .. cu_seqlens_k[b+1]`, with
int32 `cu_seqlens_q/k` of B+1 entries starting at 0, and `max_seqlen_q/k` the longest lengths.
Each sequence is its own attention problem: its queries see its keys only, and causal masks and
windows are aligned per sequence (bottom-right: query i of a sequence sees key j of it iff
j <= i + Lk - Lq). out is packed like q; lse is `(Hq, total_q)`, as FlashAttention's varlen path
returns it.

Inside fuzzattn a packed case is materialised as one dense batch element, (1, H, total, D): the
packed tensors an implementation gets are views of it (no copy: the NaN guard storage lies past
total, and the layouts carry over), and its answer is viewed back the same way, so the judge,
its tolerance and its checks see a dense case whose mask is block diagonal (FlexAttention's
document mask). This module is the one place that convention is spoken.
"""
from __future__ import annotations

import itertools

import torch

from fuzzattn.contract.case import AttentionCase


def offsets(lengths) -> list[int]:
    """cu_seqlens as a list: 0, then the running totals of `lengths`."""
    return [0, *itertools.accumulate(lengths)]


def spans(case: AttentionCase) -> list[tuple[int, int, int, int]]:
    """(q_start, q_end, k_start, k_end) of each sequence of a packed case, in packing order."""
    cq, ck = offsets(case.seqlens_q), offsets(case.seqlens_k)
    return [(cq[b], cq[b + 1], ck[b], ck[b + 1]) for b in range(len(case.seqlens_q))]


def why_not_packed(caps, case: AttentionCase) -> str | None:
    """Why `caps` (a Capabilities) does not take this case for being packed or dense, or None:
    a declaration takes packed cases only when it declares varlen, and then only those."""
    if case.varlen and not caps.varlen:
        return f"varlen ({len(case.seqlens_q)} packed sequences)"
    if caps.varlen and not case.varlen:
        return "a dense case (varlen declared: packed sequences only)"
    if not case.varlen:
        return None
    if not caps.zero_length and 0 in case.seqlens_q + case.seqlens_k:
        return f"a sequence of length 0 (seqlens_q={case.seqlens_q}, seqlens_k={case.seqlens_k})"
    for lq, lk in zip(case.seqlens_q, case.seqlens_k):
        if case.is_causal and caps.causal_equal_lengths and lq != lk:
            return f"causal={case.causal} with a sequence of lengths {lq}/{lk}"
        why = caps.why_not_lengths(lq, lk)
        if why is not None:
            return f"sequence lengths {lq}/{lk}: {why}"
    return None


# -- the call ---------------------------------------------------------------------------------
def packed(t: torch.Tensor) -> torch.Tensor:
    """(1, H, N, D) -> (N, H, D), a view of the same storage."""
    return t[0].transpose(0, 1)


def dense(t: torch.Tensor) -> torch.Tensor:
    """(N, H, D) -> (1, H, N, D), a view: what the judge compares."""
    return t.transpose(0, 1).unsqueeze(0)


def call_kwargs(case: AttentionCase, device) -> dict:
    """The packing arguments of flash_attn_varlen_func, for `case` on `device`."""
    return dict(cu_seqlens_q=torch.tensor(offsets(case.seqlens_q), dtype=torch.int32,
                                          device=device),
                cu_seqlens_k=torch.tensor(offsets(case.seqlens_k), dtype=torch.int32,
                                          device=device),
                max_seqlen_q=max(case.seqlens_q), max_seqlen_k=max(case.seqlens_k))


def check_answer(name: str, what: str, got, shape: tuple, dtype: torch.dtype, error) -> None:
    """Raise `error` naming what is wrong when `got` is not a tensor of `shape` and `dtype`."""
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != shape:
        found = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise error(f"{name} returned packed {what} of shape {found}; expected {shape}")
    if got.dtype != dtype:
        raise error(f"{name} returned packed {what} of dtype {got.dtype}; expected {dtype}")


def packed_call(name: str, fn, q, k, v, case: AttentionCase, kwargs: dict, out, lse, error):
    """Call fn on the packed views of (1, H, N, D) q, k, v; return its (out, lse or None) viewed
    back as (1, Hq, Nq, D) and (1, Hq, Nq). Out buffers, when given, are handed over packed."""
    kwargs = dict(kwargs, **call_kwargs(case, q.device))
    if out is not None:
        kwargs["out"] = packed(out)
        if lse is not None:
            kwargs["lse"] = lse[0]
    result = fn(packed(q), packed(k), packed(v), **kwargs)
    if isinstance(result, tuple) and len(result) != 2:
        raise error(f"{name} returned a tuple of {len(result)}; expected (out, lse)")
    got_out, got_lse = result if isinstance(result, tuple) else (result, None)
    total_q, heads, head_dim = q.shape[2], q.shape[1], q.shape[3]
    check_answer(name, "out", got_out, (total_q, heads, head_dim), q.dtype, error)
    if got_lse is not None:
        check_answer(name, "lse", got_lse, (heads, total_q), torch.float32, error)
        got_lse = got_lse.unsqueeze(0)
    return dense(got_out), got_lse


def packed_backward(name: str, backward_fn, q, k, v, out, lse, dout, case: AttentionCase,
                    kwargs: dict):
    """The explicit backward on packed views; (dq, dk, dv) viewed back as (1, H, N, D)."""
    kwargs = dict(kwargs, **call_kwargs(case, q.device))
    grads = backward_fn(packed(q), packed(k), packed(v), packed(out),
                        None if lse is None else lse[0], packed(dout), **kwargs)
    if not isinstance(grads, tuple) or len(grads) != 3:
        return grads              # the caller's shape checks name it
    return tuple(dense(g) if isinstance(g, torch.Tensor) and g.dim() == 3 else g for g in grads)


def check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, refuse):
    """Validate a packed call as a kernel receives it; return the offsets as two lists.
    `refuse(what, value, supported)` raises the kernel's one-line refusal."""
    for tensor, t in zip("qkv", (q, k, v)):
        if t.dim() != 3:
            refuse(f"{tensor}.shape", tuple(t.shape), "(total, heads, head_dim)")
    cu = []
    for which, c, t, longest in (("q", cu_seqlens_q, q, max_seqlen_q),
                                 ("k", cu_seqlens_k, k, max_seqlen_k)):
        if not isinstance(c, torch.Tensor) or c.dtype != torch.int32 or c.dim() != 1 \
                or c.numel() < 2:
            refuse(f"cu_seqlens_{which}", c, "an int32 vector of B+1 >= 2 offsets")
        offs = c.tolist()
        lengths = [b - a for a, b in zip(offs, offs[1:])]
        if offs[0] != 0 or min(lengths) < 0 or offs[-1] != t.shape[0]:
            refuse(f"cu_seqlens_{which}", offs, f"non-decreasing from 0 to {t.shape[0]}")
        if not isinstance(longest, int) or longest < max(lengths):
            refuse(f"max_seqlen_{which}", longest, f"an int >= {max(lengths)}")
        cu.append(offs)
    if len(cu[0]) != len(cu[1]):
        refuse("cu_seqlens_k", cu[1], f"{len(cu[0])} offsets, as cu_seqlens_q has")
    return cu[0], cu[1]


def relengthed(seqlens_q, seqlens_k) -> dict:
    """The AttentionCase.replace changes that make a packed case these sequences."""
    return dict(seqlens_q=tuple(seqlens_q), seqlens_k=tuple(seqlens_k), seq_q=sum(seqlens_q),
                seq_k=sum(seqlens_k))
