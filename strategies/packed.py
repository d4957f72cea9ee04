"""Packed ragged batches: the sequences' lengths, drawn only for implementations declaring varlen.

A packed batch is a list of (Nq, Nk) pairs, one per sequence, each drawn from the shape families
of strategies/lengths.py within the declaration's length constraints (0 and 1, tile edges +-1,
decode, tall ...). Hypothesis shrinks a list toward fewer elements and each element toward the
simplest pair, so a failure is reported with the fewest, shortest sequences that show it.
"""
from __future__ import annotations

import dataclasses

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from fuzzattn.contract.varlen import relengthed

# Sequences per unit of a profile's max_batch: a packed batch is where many short sequences meet
# (the ci and dev profiles: up to 6; gpu: up to 12).
SEQUENCES_PER_BATCH = 3


def packed_lengths(pairs: st.SearchStrategy, *, max_sequences: int, allow_zero: bool = False
                   ) -> st.SearchStrategy[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(seqlens_q, seqlens_k) of 1 to `max_sequences` sequences, each an (family, Nq, Nk) draw of
    `pairs`, shrinking toward one sequence. With `allow_zero`, one sequence in five has no
    queries or no keys (the shape families alone give a 0 in about one case in twenty), where a
    kernel's offsets must skip a sequence without shifting its neighbours."""
    if max_sequences < 1:
        raise InvalidArgument(f"max_sequences={max_sequences} must be at least 1")
    if allow_zero:
        pairs = st.one_of(*[pairs] * 8, pairs.map(lambda p: ("no_queries", 0, p[2])),
                          pairs.map(lambda p: ("no_keys", p[1], 0)))
    return st.lists(pairs, min_size=1, max_size=max_sequences).map(
        lambda drawn: (tuple(nq for _, nq, _ in drawn), tuple(nk for _, _, nk in drawn)))


def packed_profile(profile):
    """The profile one sequence of a packed batch is drawn under: no long outlier (a packed
    batch already multiplies the lengths the oracle's block mask spans)."""
    return dataclasses.replace(profile, max_large_seq=profile.max_seq)


def on_first_sequence(edit):
    """An undeclared-case edit (case -> strategy of cases) that also takes packed cases: their
    first sequence is edited as a dense case of its own lengths, and spliced back, so a length
    edit (Nq = 0, Nk = Nq + 1 ...) lands on one sequence and the totals follow."""
    def apply(case):
        if not case.varlen:
            return edit(case)
        rest_q, rest_k = case.seqlens_q[1:], case.seqlens_k[1:]
        first = case.replace(seqlens_q=(), seqlens_k=(), seq_q=case.seqlens_q[0],
                             seq_k=case.seqlens_k[0])
        return edit(first).map(lambda e: e.replace(**relengthed((e.seq_q,) + rest_q,
                                                                (e.seq_k,) + rest_k)))
    return apply
