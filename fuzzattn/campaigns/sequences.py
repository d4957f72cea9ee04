"""What a packed case's sequences add to a cause's search: its one-change predicates and the
shrink steps toward fewer, shorter sequences (fuzzattn/contract/varlen.py defines the case).

    sequences>1             undone by each sequence alone: a leak between sequences needs two
    a sequence of length 0  undone by every length 0 made 1: offsets that a skipped, empty
                            sequence throws off need one
"""
from __future__ import annotations

from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.varlen import relengthed

MANY_SEQUENCES = "sequences>1"
EMPTY_SEQUENCE = "a sequence of length 0"


def predicates(case: AttentionCase) -> dict[str, tuple[str, list[AttentionCase]]]:
    """Each packed-batch predicate `case` satisfies -> ("", the cases with it undone), in the
    form campaigns/defects.py's one-change predicates take; {} for a dense case."""
    found: dict[str, tuple[str, list[AttentionCase]]] = {}
    if not case.varlen:
        return found
    pairs = list(zip(case.seqlens_q, case.seqlens_k))
    if len(pairs) > 1:
        alone = dict.fromkeys(case.replace(**relengthed((lq,), (lk,))) for lq, lk in pairs)
        found[MANY_SEQUENCES] = ("", list(alone))
    if 0 in case.seqlens_q + case.seqlens_k:
        found[EMPTY_SEQUENCE] = ("", [case.replace(**relengthed(
            [max(n, 1) for n in case.seqlens_q], [max(n, 1) for n in case.seqlens_k]))])
    return found


def shrink_steps(case: AttentionCase) -> list[dict]:
    """AttentionCase.replace changes toward fewer, then shorter, sequences, largest first: the
    first half, each sequence dropped, every length halved; [] for a dense case."""
    if not case.varlen:
        return []
    pairs = list(zip(case.seqlens_q, case.seqlens_k))
    subsets = [pairs[:len(pairs) // 2]] if len(pairs) > 2 else []
    subsets += [pairs[:i] + pairs[i + 1:] for i in range(len(pairs))] if len(pairs) > 1 else []
    subsets.append([(lq // 2, lk // 2) for lq, lk in pairs])
    return [relengthed([lq for lq, _ in s], [lk for _, lk in s]) for s in subsets
            if s and s != pairs]
