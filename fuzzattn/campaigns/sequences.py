"""What a case's lengths add to a cause's search: its one-change predicates.

A dense case's lengths:

    lengths=Nq<Nk / Nq>Nk   undone by Nk set to Nq and by Nq set to Nk, so a bug needing more
                            than one key or query is not taken for one needing unequal lengths
    Nk odd                  undone by Nk + 1, keeping how Nq compares with Nk
    last page partial       a paged cache's Nk off whole pages, undone by Nk up to the next
                            whole page, the same way; where that is Nk + 1, it is named alone

A packed case's sequences (fuzzattn/contract/varlen.py defines the case), toward fewer, shorter
sequences:

    sequences>1             undone by each sequence alone: a leak between sequences needs two
    a sequence of length 0  undone by every length 0 made 1: offsets that a skipped, empty
                            sequence throws off need one
"""
from __future__ import annotations

from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.varlen import relengthed

# Predicates are factors with no value: the table names them alone ("Nk odd").
PREDICATE = ""
MANY_SEQUENCES = "sequences>1"
EMPTY_SEQUENCE = "a sequence of length 0"
PARTIAL_PAGE = "last page partial"


def predicates(case: AttentionCase) -> dict[str, tuple[str, list[AttentionCase]]]:
    """Each length predicate `case` satisfies -> (its value, the cases with it undone), in the
    form campaigns/defects.py's one-change predicates take."""
    found: dict[str, tuple[str, list[AttentionCase]]] = {}
    if not case.varlen:
        return _dense_predicates(case)
    pairs = list(zip(case.seqlens_q, case.seqlens_k))
    if len(pairs) > 1:
        alone = dict.fromkeys(case.replace(**relengthed((lq,), (lk,))) for lq, lk in pairs)
        found[MANY_SEQUENCES] = (PREDICATE, list(alone))
    if 0 in case.seqlens_q + case.seqlens_k:
        found[EMPTY_SEQUENCE] = (PREDICATE, [case.replace(**relengthed(
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


def _dense_predicates(case: AttentionCase) -> dict[str, tuple[str, list[AttentionCase]]]:
    found: dict[str, tuple[str, list[AttentionCase]]] = {}
    if case.seq_q != case.seq_k:
        found["lengths"] = ("Nq<Nk" if case.seq_q < case.seq_k else "Nq>Nk",
                            [case.replace(seq_k=case.seq_q), case.replace(seq_q=case.seq_k)])
    whole_pages = None
    if case.paged_kv and case.seq_k % case.paged_kv:
        # A kernel reading the last page whole, or skipping it, needs its tail: one bug whatever
        # the page size, not "Nk odd" at size 2 and something else at size 3.
        whole_pages = _longer(case, -case.seq_k % case.paged_kv)
        found[PARTIAL_PAGE] = (PREDICATE, [whole_pages])
    if case.seq_k % 2 and _longer(case, 1) != whole_pages:
        found["Nk odd"] = (PREDICATE, [_longer(case, 1)])
    return found


def _longer(case: AttentionCase, keys: int) -> AttentionCase:
    """Nk + keys, keeping how Nq compares with Nk (which rows see no key, which mask applies);
    where it cannot, Nq + keys too."""
    longer = case.replace(seq_k=case.seq_k + keys)
    if (longer.seq_q > longer.seq_k) != (case.seq_q > case.seq_k) or \
            (longer.seq_q == longer.seq_k) != (case.seq_q == case.seq_k):
        longer = case.replace(seq_q=case.seq_q + keys, seq_k=case.seq_k + keys)
    return longer
