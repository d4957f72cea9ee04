"""Seeded bugs in the packed varlen loop (kernels/torch_varlen.py): one source edit each.

Both show only on packed cases with more than one sequence: a leak needs a next sequence to read
from, and a dropped sequence needs a last one with queries besides the first.
"""
from __future__ import annotations

from pathlib import Path

from fuzzattn.contract import Implementation
from fuzzattn.kernels import torch_varlen

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

MUTANTS = tuple(
    Implementation(name=name, fn=mutate(torch_varlen.IMPL.fn, edits, name=name),
                   caps=torch_varlen.IMPL.caps, description=description,
                   mutant_of=torch_varlen.IMPL.name, backend=torch_varlen.IMPL.backend,
                   sources=(_HERE,) + torch_varlen.IMPL.sources)
    for name, description, edits in VARLEN_BUGS)
