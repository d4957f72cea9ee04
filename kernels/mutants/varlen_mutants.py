"""Seeded bugs in packed varlen attention: one source edit each, in the tiled loop over the
sequences (kernels/torch_varlen.py) or in the Triton kernel's per-sequence addressing
(kernels/triton_fa2_varlen.py, the VARLEN branch of kernels/triton_fa2.py's kernel).

They show only on packed cases with more than one sequence (or lengths that differ between q
and k): a leak needs a next sequence to read from, a dropped sequence a last one with queries
besides the first, and a misaligned diagonal a sequence whose lengths differ.
"""
from __future__ import annotations

from pathlib import Path

from fuzzattn.contract import Implementation
from fuzzattn.kernels import torch_varlen, triton_fa2_varlen
from fuzzattn.kernels.triton_fa2 import _attend_key_blocks, fa2_fwd_kernel

from .edit import mutate

_HERE = str(Path(__file__).resolve())

VARLEN_BUGS = (
    ("mutant_varlen_reads_next_sequence",
     "cu_seqlens_k read one sequence off at the end: each sequence's keys run on through the "
     "next sequence's, so its queries see them (a cross-sequence leak)",
     [("k0, k1 = cu_k[b], cu_k[b + 1]", "k0, k1 = cu_k[b], cu_k[min(b + 2, len(cu_k) - 1)]")]),
    ("mutant_varlen_drops_last_sequence",
     "the loop stops one sequence short: the last sequence's rows of torch.empty out and lse "
     "are never written",
     [("for b in range(len(cu_q) - 1):", "for b in range(len(cu_q) - 2):")]),
)

TRITON_VARLEN_BUGS = (
    ("mutant_triton_varlen_kv_not_offset",
     "the kernel moves q and out to each sequence's rows but not k and v: every sequence "
     "attends to the first sequence's keys and values (a cross-sequence leak)",
     [("k_base += k_start.to(tl.int64) * stride_kn", "k_base += 0"),
      ("v_base += k_start.to(tl.int64) * stride_vn", "v_base += 0")]),
    ("mutant_triton_varlen_square_diagonal",
     "the kernel aligns each sequence's bottom-right diagonal and window as if its lengths were "
     "equal (the shift Nk - Nq of the whole batch's maxima, or none, in place of its own)",
     [("CAUSAL_SHIFT = tl.minimum(SEQ_UPPER_TOP, N_KEYS - N_QUERIES + SEQ_UPPER_DIAGONAL)",
       "CAUSAL_SHIFT = tl.minimum(SEQ_UPPER_TOP, SEQ_UPPER_DIAGONAL)"),
      ("LEFT_SHIFT = N_KEYS - N_QUERIES + SEQ_LOWER_DIAGONAL", "LEFT_SHIFT = SEQ_LOWER_DIAGONAL")]),
)


def _triton_forward(kernel, name: str):
    def forward(q, k, v, **kwargs):
        return triton_fa2_varlen.triton_fa2_varlen_forward(q, k, v, kernel=kernel, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    return forward


MUTANTS = tuple(
    Implementation(name=name, fn=mutate(torch_varlen.IMPL.fn, edits, name=name),
                   caps=torch_varlen.IMPL.caps, description=description,
                   mutant_of=torch_varlen.IMPL.name, backend=torch_varlen.IMPL.backend,
                   sources=(_HERE,) + torch_varlen.IMPL.sources)
    for name, description, edits in VARLEN_BUGS
) + tuple(
    Implementation(name=name, caps=triton_fa2_varlen.IMPL.caps, description=description,
                   fn=_triton_forward(mutate(fa2_fwd_kernel, edits, name=name,
                                             helpers=(_attend_key_blocks,)), name),
                   mutant_of=triton_fa2_varlen.IMPL.name, backend="triton",
                   sources=(_HERE,) + triton_fa2_varlen.IMPL.sources,
                   backward_fn=triton_fa2_varlen.IMPL.backward_fn)       # forward bugs only
    for name, description, edits in TRITON_VARLEN_BUGS)
