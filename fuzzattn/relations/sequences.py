"""sequence_isolation: the metamorphic relation only packed ragged batches need.

A packed sequence's queries see its own keys only (fuzzattn/contract/varlen.py), so replacing
every other sequence's keys and values must leave its rows unchanged. The oracle comparison sees
a leak too; this relation names it, on the sequence where it happens, with no oracle at all.
"""
from __future__ import annotations

import torch

from fuzzattn.contract.varlen import spans
from fuzzattn.inputs.materialize import materialize
from fuzzattn.relations.rounding import Rounding, max_abs_v
from fuzzattn.relations.runs import as_relation, case_generator, relation_verdict, row_errors, \
    run_once

REPLACEMENT_SCALE = 16.0      # as causal_prefix's: large, finite, so a leaked key moves the row


@as_relation("sequence_isolation")
def sequence_isolation(impl, case, device):
    """Replace the keys and values of every sequence but one (chosen from the case's seed among
    those with queries, when another holds keys) with 16 * N(0, 1) values: that sequence's rows
    of out and lse must be unchanged, exactly. Never NaN: a correct kernel may load a
    neighbour's keys and weight them 0 * v.
    Tolerance: none for deterministic kernels (every quantity entering a checked row is the same
    in both runs, and a key it does not see contributes exact zeros); deterministic=False kernels
    get both runs' whole error, as causal_prefix gives them."""
    from fuzzattn.relations.forward import _lse_allowed, _lse_part, _out_allowed, _transformed
    if not case.varlen:
        return None
    eligible = [s for s in spans(case) if s[1] > s[0] and s[3] - s[2] < case.seq_k]
    if not eligible:
        return None
    g = case_generator(case)
    q0, q1, k0, k1 = eligible[int(torch.randint(len(eligible), (1,), generator=g))]
    inputs = materialize(case, device)
    replaced = {}
    for name in "kv":
        tensor = getattr(inputs, name).clone()
        fresh = (REPLACEMENT_SCALE * torch.randn(tensor.shape, generator=g)).to(tensor.dtype)
        fresh[:, :, k0:k1] = tensor[:, :, k0:k1].cpu()
        replaced[name] = fresh.to(device)
    replaced = _transformed(case, device, **replaced)
    out, lse = run_once(impl, *inputs.tensors(), case, "original")
    out2, lse2 = run_once(impl, *replaced.tensors(), case, "others replaced")
    rows = torch.arange(case.seq_q, device=device)
    checked = ((rows >= q0) & (rows < q1)).expand(out.shape[:3])
    allowed = lse_allowed = torch.zeros((), dtype=torch.float64, device=device)
    if not impl.caps.deterministic:
        r = Rounding(impl, case)
        eps = r.score_error(inputs.q, inputs.k, case.group_size)
        allowed = _out_allowed(r, (eps, eps), max_abs_v(inputs.v, case.group_size), (out, out2))
        if lse is not None and lse2 is not None:
            lse_allowed = _lse_allowed(r, (eps, eps), (lse, lse2))
    parts = [("out", row_errors(out2, out), allowed, checked)]
    if lse is not None and lse2 is not None:
        parts.append(_lse_part(lse2, lse, lse_allowed, checked))
    return relation_verdict("sequence_isolation", impl, case, parts,
                            note=f"keys outside {k0}-{k1 - 1} replaced; rows {q0}-{q1 - 1} checked")
