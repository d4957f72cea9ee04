"""How a relation runs an implementation and judges its two runs: the machinery the forward
relations (fuzzattn.relations.forward) and the gradient ones (fuzzattn.relations.backward) share.

A crash in a run fails the relation (`RunFailed`); a declared refusal, a case outside the
declaration or one a declared known upstream defect covers makes it not apply (None). Row
errors are float64 |got - expected| with NaN on either side an infinite error, and
`relation_verdict` turns (quantity, row errors, rows allowed, rows checked) parts into one
named verdict.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.implementation import Implementation
from fuzzattn.contract.known_defects import covering
from fuzzattn.run import execute
from fuzzattn.judgement.judge import default_device, skip_reason
from fuzzattn.judging.oracle import case_visible_keys
from fuzzattn.judging.verdict import Verdict, heatmap, locate

PREFIX = "metamorphic:"


class RunFailed(Exception):
    """The implementation raised in one of a relation's runs: the relation fails, so detailed."""


class RunRefused(Exception):
    """A run refused the way the implementation declares (Capabilities.refusals; FLASH on CUDA:
    causal with Nq != Nk): the relation does not apply, as a campaign counts such a draw."""


def case_generator(case: AttentionCase) -> torch.Generator:
    return torch.Generator().manual_seed(case.data_seed)


def run_once(impl: Implementation, q, k, v, case: AttentionCase, which: str):
    call = execute.call(impl, q, k, v, case)
    if call.declared_refusal:
        raise RunRefused(call.summary)
    if not call.answered:   # a crash on a declared case is a failed relation, not a harness error
        raise RunFailed(f"{which} run raised {call.summary}")
    return call.out, call.lse


def rows_with_keys(case: AttentionCase, device) -> torch.Tensor:
    """(Nq,) bool: rows that see at least one key (the others are out 0, lse -inf)."""
    mask = case_visible_keys(case, device)
    if mask is None:
        return torch.full((case.seq_q,), case.seq_k > 0, dtype=torch.bool, device=device)
    return mask.any(dim=-1)


# -- judging one relation ---------------------------------------------------------------------
def row_errors(got: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """|got - expected| in float64, per row for outputs; equal values (-inf lse included) give 0,
    and NaN on either side gives inf: the identities hold between finite numbers only."""
    got, expected = got.to(torch.float64), expected.to(torch.float64)
    err = torch.where(got == expected, torch.zeros_like(got), (got - expected).abs())
    err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
    return err.amax(dim=-1) if err.dim() == 4 else err


def relation_verdict(name: str, impl: Implementation, case: AttentionCase, parts,
                     note: str = "") -> Verdict:
    """One verdict from (quantity, row errors, rows allowed, rows checked) parts: out, then lse.

    error/allowed are those of the worst row (largest error over allowed), among the failing
    quantities when any fails."""
    failed, worst, bad_rows = [], None, None
    for quantity, errors, allowed, checked in parts:
        allowed = torch.broadcast_to(allowed, errors.shape)
        bad = (errors > allowed) & checked
        if bool(bad.any()):
            failed.append(quantity)
            bad_rows = bad if bad_rows is None else bad_rows | bad
        if errors.numel() == 0:
            continue
        ratio = torch.where(checked, errors / allowed.clamp_min(1e-300), torch.zeros_like(errors))
        i = int(torch.argmax(ratio.flatten()))
        candidate = (bool(bad.any()), float(ratio.flatten()[i]), quantity,
                     float(errors.flatten()[i]), float(allowed.flatten()[i]))
        if worst is None or candidate[:2] > worst[:2]:
            worst = candidate
    detail = note
    if failed:
        detail = f"{' and '.join(failed)} break the relation" + (f"; {note}" if note else "")
    if failed and worst[2] != "out":
        detail += f" (error/allowed are {worst[2]}'s)"
    error, allowed = (worst[3], worst[4]) if worst is not None else (None, None)
    return Verdict(impl=impl.name, case=case, check=PREFIX + name, passed=not failed, error=error,
                   allowed=allowed, where=locate(bad_rows) if failed else "",
                   heatmap=heatmap(bad_rows) if failed else "", detail=detail)


def all_rows(out: torch.Tensor) -> torch.Tensor:
    return torch.ones(out.shape[:3], dtype=torch.bool, device=out.device)


# The identities a variant breaks: permuting keys moves them across a window's edges and along
# ALiBi's distances, and a softcap's tanh does not commute with adding a constant to a row's
# scores. The others hold (the rows they check come from the case's full mask, window included;
# a bias of the positions alone moves with neither a shift of the scores nor of the values).
# A paged cache breaks none: the call pages the dense tensors each relation transforms. A packed
# batch breaks key permutations (keys move between sequences) and the causal prefix (a cut
# through a packed batch is not one causal prefix).
BROKEN_BY = {"window": ("key_permutation", "grad_key_permutation"), "softcap": ("score_shift",),
             "alibi": ("key_permutation", "grad_key_permutation"), "paged_kv": (),
             "varlen": ("key_permutation", "grad_key_permutation", "causal_prefix")}


def as_relation(name: str):
    """A relation body made a relation: RunFailed is a failed verdict; None (does not apply)
    for a case outside the declaration or a known upstream defect's, for one using a variant
    that breaks it (BROKEN_BY), and after a refusal."""
    def wrap(body: Callable) -> Callable:
        def relation(impl: Implementation, case: AttentionCase, device=None) -> Verdict | None:
            device = device or default_device()
            if any(name in BROKEN_BY[variant] for variant in case.variants):
                return None
            if skip_reason(impl, case) is not None or covering(
                    impl.caps.known_defects, case, device, gradients=name.startswith("grad_")):
                return None
            try:
                return body(impl, case, device)
            except RunFailed as exc:
                return Verdict(impl=impl.name, case=case, check=PREFIX + name, passed=False,
                               detail=str(exc))
            except RunRefused:
                return None
        relation.__name__ = name
        relation.__doc__ = body.__doc__
        return relation
    return wrap
