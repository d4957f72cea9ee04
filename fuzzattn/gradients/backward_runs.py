"""The backward runs of a judged case: the adversarial run (q, k, v, dO and the forward's out and
lse inside NaN padding, fresh allocations NaN-filled, storages snapshotted to catch mutation) and
the plain rerun that determinism is checked on."""
from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.dtypes import BY_NAME
from fuzzattn.contract.implementation import Implementation
from fuzzattn.gradients.reference_gradients import NAMES
from fuzzattn.run import execute
from fuzzattn.inputs.materialize import (Inputs, born_on_device, changed_flags, materialize,
                                         materialize_dout, moved_with, place, place_flat, view_in)
from fuzzattn.judging.placement import moved
from fuzzattn.inputs.transfer import read_back, same_device
from fuzzattn.inputs.nan_fill import adversarial_memory, prime_allocator
from fuzzattn.judging.verdict import Verdict


@dataclasses.dataclass
class GradRun:
    call: execute.Call
    failure: Verdict | None = None
    side_effects: list[Verdict] = dataclasses.field(default_factory=list)
    inputs: Inputs | None = None            # q, k, v it ran on (their host copy: the oracle's)
    delivered: tuple | None = None          # (device, grads): the gradients where they are judged
    # dO as it was before the call (its snapshot, never handed to the implementation), read back
    # with the gradients: the host oracle's, for inputs born on the device (a counter case).
    dout_here: torch.Tensor | None = None

    @property
    def grads(self) -> dict[str, torch.Tensor]:
        return dict(zip(NAMES, self.call.grads))


def _gradient_bytes(case: AttentionCase) -> tuple[int, int, int]:
    """The sizes of dq, of dk and dv, and of an fp32 per-row temporary such as Delta."""
    item = BY_NAME[case.dtype].itemsize
    return (math.prod(case.shape("q")) * item, math.prod(case.shape("k")) * item,
            case.batch * case.heads * case.seq_q * 4)


def _prime(case: AttentionCase, device, byte: int) -> None:
    """Freed blocks of the gradients' sizes; off the CPU only, for the reason the forward's
    priming gives (runs.prime_for_outputs): there every tensor the backward allocates is
    NaN-filled or zeroed whatever malloc hands back, and the 24 fills a run made
    bought nothing."""
    if torch.device(device).type == "cpu":
        return
    prime_allocator(_gradient_bytes(case), device, byte)


def _call_inputs(case: AttentionCase, device, forward, source: Inputs | None,
                 pad_value: float) -> tuple[Inputs, dict, dict]:
    """Fresh NaN-guarded q, k, v, dO (and the forward's out and lse) on `device`: the inputs,
    every storage by name (for the mutation check) and the views of dO, out and lse by name."""
    if born_on_device(case, device):
        # A counter case: q, k, v (copied from `source`, then on the device) and dO computed on
        # the device, nothing moved but an explicit backward's out and lse.
        place_on = device
        inputs = (source.copy() if source is not None and math.isnan(pad_value)
                  else materialize(case, device, pad_value=pad_value))
    else:
        # Built on the CPU and moved in one transfer: q, k, v, dO and the forward's out and lse.
        place_on = "cpu"
        if source is not None and math.isnan(pad_value):
            inputs = source.copy() if torch.device(device).type == "cpu" else source
        else:
            inputs = materialize(case, "cpu", pad_value=pad_value)
    extra = {"dout": materialize_dout(case, place_on, pad_value)}
    if forward is not None:
        extra["out"] = place(forward[0], case.layout[0], forward[0].dtype, place_on, pad_value)
        if forward[1] is not None:
            extra["lse"] = place_flat(forward[1].to(place_on), place_on, pad_value)
    inputs, extra_storages, views = moved_with(inputs, extra, device)
    return inputs, {**inputs.storages, **extra_storages}, views


def run_backward(impl: Implementation, case: AttentionCase, device, forward, *, adversarial: bool,
         pad_value: float = float("nan"), poison: bool = True, here=None,
         source: Inputs | None = None, side_effects: bool = True,
         dout_for: torch.device | None = None) -> GradRun:
    """One gradient call on fresh copies of q, k, v, dO (and of the forward's out and lse for an
    explicit backward); the gradients are also delivered to `here` (default: `device`), in the
    same transfer as the input-mutation check's verdicts. `source`: inputs of this case with NaN
    padding that no implementation is ever handed (the judgement's pristine ones: on the host,
    or on the device for a counter case), copied instead of materialised again; other padding
    is always materialised anew.
    `side_effects=False`: the gradients only (the determinism rerun: the first run's input
    mutation check covers the backward), no snapshot of the storages and no flags.
    `dout_for`: where the gradient oracle computes; when that is `here` and the case's dO exists
    only on the device (a counter case), its snapshot comes back with the gradients (`dout_here`)."""
    inputs, storages, views = _call_inputs(case, device, forward, source, pad_value)
    dout, out, lse = views["dout"], views.get("out"), views.get("lse")
    snapshot = {name: s.clone() for name, s in storages.items()} if side_effects else None
    if adversarial:
        _prime(case, device, 0xFF if poison else 0x00)
    # The attribution's clean re-runs (poison=False) zero every tensor the backward allocates, as
    # the forward's do (fuzzattn/run/runs.py): zeroed freed blocks alone depend on which block malloc
    # hands back, and a NaN block freed by the poisoned run made an unwritten dq read as
    # grad_nonfinite (seen once in a full suite run on the CPU, after the collector's full
    # passes became rarer and changed when such blocks were freed).
    if not adversarial:
        memory = contextlib.nullcontext()
    else:
        memory = adversarial_memory(poison, impl.caps.compiles_per_shape)
    with memory:
        # Not synchronised on its own (fuzzattn/run/runs.py): a device fault surfaces in the read-back.
        call = execute.call_gradients(impl, *inputs.tensors(), dout, case, out=out, lse=lse,
                                      synchronize=False)
    run = GradRun(call, inputs=inputs)
    verdict = dict(impl=impl.name, case=case)
    if not call.answered:
        what = "refused a case its forward accepts" if call.status == execute.REFUSED else "raised"
        detail = call.summary if call.status == execute.CONTRACT else f"backward {what}: {call.summary}"
        run.failure = Verdict(check="grad_crash", passed=False, detail=detail,
                              origin=call.origin, **verdict)
        return run
    names = list(storages)
    here = torch.device(here or device)
    # A counter case whose oracle computes on the host: its dO exists only on the device; the
    # oracle's copy comes back with the gradients, in the same transfer.
    dout_back = ([snapshot["dout"]] if side_effects and dout_for is not None
                 and born_on_device(case, device) and not same_device(device, here)
                 and same_device(dout_for, here) else [])
    try:
        flags = changed_flags(storages, snapshot) if side_effects else None
        flags, *grads = read_back([flags, *call.grads, *dout_back], here)
        if dout_back:
            stored, grads = grads[-1], grads[:-1]
            run_dout = view_in(stored, storages["dout"], dout)
        flags = flags.tolist() if side_effects else None
    except Exception as exc:           # an asynchronous fault of the backward, surfacing here
        execute.end_on_device_fault(impl, case, "backward", execute.one_line(exc), device)
        run.failure = Verdict(check="grad_crash", passed=False,
                              detail=f"backward raised: {execute.one_line(exc)}", **verdict)
        return run
    run.delivered = (here, tuple(grads))
    if dout_back:
        run.dout_here = run_dout
    if not side_effects:
        return run
    changed = [name for name, flag in zip(names, flags) if flag]
    run.side_effects.append(Verdict(
        check="grad_inputs_mutated", passed=not changed,
        detail=f"storage of {', '.join(changed)} changed by the backward" if changed else "",
        **verdict))
    return run


def on_device(run: GradRun, device: torch.device) -> GradRun:
    """`run` with its gradients on `device`, where the judgement computes (judging/placement.py)."""
    if run.call.grads is None or all(same_device(g.device, device) for g in run.call.grads):
        return run
    if run.delivered is not None and same_device(run.delivered[0], device):
        grads = run.delivered[1]
    else:
        grads = tuple(moved(g, device) for g in run.call.grads)
    call = dataclasses.replace(run.call, grads=grads)
    return dataclasses.replace(run, call=call)
