"""The `covers` line of a regression file, written from the defect it records.

A file written by a campaign learns its cause once the defect's trigger is known
(campaigns/defects.py: `needs causal=top_left lengths=Nq<Nk`); its covers line then says the
symptom and that trigger: "mine: wrong out when causal=top_left Nq<Nk". A file written by a
pytest test, where no trigger is computed, names the symptom and what its shrunk case has off
the plainest choice: "mine: wrong out with causal=top_left and Nq<Nk". Either stays a plain line
a person may rewrite: a line someone edited is never replaced.
"""
from __future__ import annotations

import dataclasses

from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.dtypes import BY_NAME

# Checks whose failure is not a wrong number, in words; any other check is "wrong <check>".
_SYMPTOMS = {
    "inputs_drifted": "inputs drifted", "flaky": "flaky result", "crash": "crashes",
    "device_fault": "faults the device", "segfault": "kills its process", "hang": "hangs",
    "no_configuration_compiles": "no configuration compiles",
    "contract": "answers outside the contract", "inputs_mutated": "mutates its inputs",
    "out_of_bounds_write": "writes out of bounds", "out_of_bounds_read": "reads out of bounds",
    "unwritten_output": "leaves output unwritten", "nonfinite": "non-finite output",
    "nondeterministic": "nondeterministic output", "grad_crash": "backward crashes",
    "grad_inputs_mutated": "backward mutates its inputs",
    "grad_out_of_bounds_read": "backward reads out of bounds",
    "grad_unwritten": "leaves a gradient unwritten", "grad_nonfinite": "non-finite gradient",
    "grad_nondeterministic": "nondeterministic gradients",
    "refusal": "answers an input it does not declare",
}
# What older fuzzattn wrote when nobody named the bug: replaced like today's written lines.
_OLD_SUFFIX = "(found by fuzzing; edit this line to name the bug class)"


def symptom(check: str) -> str:
    return _SYMPTOMS.get(check, f"wrong {check}")


def salient(case: AttentionCase) -> str:
    """What the case has off the plainest choice: 'causal=top_left and Nq<Nk', or ''."""
    found = []
    if case.causal != "none":
        found.append(f"causal={case.causal}")
    if case.seq_q != case.seq_k:
        found.append("Nq<Nk" if case.seq_q < case.seq_k else "Nq>Nk")
    if case.heads != case.kv_heads:
        found.append(f"GQA (H={case.heads}/{case.kv_heads})")
    found += [f"layout[{t}]={layout}" for t, layout in zip("qkv", case.layout)
              if layout != "contiguous"]
    if case.values != "normal":
        found.append(f"values={case.values}")
    if case.scale is not None:
        found.append(f"scale={case.scale:g}")
    if case.windowed:
        found.append(f"window={case.window[0]},{case.window[1]}")
    if case.softcap:
        found.append(f"softcap={case.softcap:g}")
    if case.alibi:
        found.append(f"alibi={case.alibi}")
    if case.paged_kv:
        found.append(f"paged_kv={case.paged_kv}")
    if case.varlen:
        found.append(f"{len(case.seqlens_q)} packed sequences")
    if case.dtype != "float32":
        found.append(BY_NAME[case.dtype].short)
    return " and ".join(found)


def written(impl: str, check: str, case: AttentionCase, cause: str | None = None) -> str:
    """The covers line for `impl` failing `check` on `case`, from its `cause` when known."""
    head = f"{impl}: {symptom(check)}"
    if cause is not None and cause.startswith("needs "):
        return f"{head} when {cause[len('needs '):].replace('lengths=', '')}"
    if cause is not None:
        return f"{head} on the plainest case"
    features = salient(case)
    return f"{head} with {features}" if features else f"{head} on a plain case"


def with_cause(record, cause: str):
    """The record with its cause, and its covers line written from it unless someone edited it."""
    covers = record.covers
    if record.impl and record.check and (
            not covers or covers.endswith(_OLD_SUFFIX)
            or covers == written(record.impl, record.check, record.case)):
        covers = written(record.impl, record.check, record.case, cause)
    return dataclasses.replace(record, cause=cause, covers=covers, path=None)
