"""One run of an implementation under test, and what it can only be caught doing while it runs:
writing into its inputs, writing past its output buffers, leaving output memory unwritten.

A run is *launched* (`launch`: the call, its memory poisoning and its check flags queued on the
device) and then *delivered* (`deliver`: its flags and outputs read back, maybe together with
another run's, and turned into side-effect verdicts). `run` does both. The split exists for the
GPU: several fuzzing processes share it by CUDA's time-slicing between their contexts, and every
wait for the device costs a turn of it. So a run is never synchronised on its own, and two runs
can share one read-back.

The adversarial run's inputs sit in NaN-padded storage, and its outputs are either caller-provided
buffers pre-filled with NaN between canary guards (`out_buffer` implementations) or allocated right
after the allocator was handed NaN-filled blocks of the same sizes, so stale memory shows. A plain
run gets plain allocations.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.dtypes import BY_NAME
from fuzzattn.contract.implementation import Implementation
from fuzzattn.run import execute
from fuzzattn.inputs.materialize import Inputs, as_bits, changed_anywhere, changed_flags, materialize
from fuzzattn.inputs.nan_fill import adversarial_memory, prime_allocator
from fuzzattn.inputs.transfer import read_back
from fuzzattn.judging.verdict import Verdict

# Canary elements on each side of an output buffer: as many as the buffer holds (at least 4096),
# so a store with a wrong tile mask or a swapped batch/head index lands in the canary, not in
# the harness's own heap.
MIN_GUARD = 4096
CANARY = {2: 0x5A5A, 4: 0x5A5A5A5A}          # bit pattern by element size: no kernel writes it


# -- output buffers ---------------------------------------------------------------------------
class GuardedBuffer:
    """A contiguous output tensor between two canary regions, its body pre-filled with NaN."""

    def __init__(self, shape, dtype, device):
        numel = math.prod(shape)
        self.guard = guard = max(MIN_GUARD, numel)
        self.storage = torch.empty(guard + numel + guard, dtype=dtype, device=device)
        self.pattern = CANARY[self.storage.element_size()]
        as_bits(self.storage).fill_(self.pattern)
        self.tensor = self.storage[guard:guard + numel].view(shape)
        self.tensor.fill_(float("nan"))

    def canary_broken(self) -> torch.Tensor:
        """A 0-dim bool tensor on the buffer's device (read back with the run's other results)."""
        bits = as_bits(self.storage)
        g = self.guard
        # Both guards as the two rows of one strided view: one comparison and one reduction
        # (each launch is a wait on a GPU shared by several fuzzing processes).
        guards = bits.as_strided((2, g), (bits.numel() - g, 1), bits.storage_offset())
        return (guards != self.pattern).any()


def prime_for_outputs(case: AttentionCase, device, byte: int) -> None:
    """poison.prime_allocator with the sizes of this case's out and lse; off the CPU only.

    CUDA's caching allocator hands freed blocks back for same-size requests, raw allocations
    (library workspaces) included, which torch's NaN fill of empty tensors never sees. On the CPU
    a forward run needs no priming: every tensor the kernel allocates is NaN-filled
    (`uninitialized_memory_is_nan`) or zeroed (`UninitializedMemoryIsZero`, the attribution
    re-runs but a per-shape compiler's: nan_fill.adversarial_memory) whatever malloc hands
    back, and malloc's reuse of a primed chunk was never reliable. There the 16 fills cost ~1.4% of a ci case (py-spy, sdpa fp32) and bought nothing."""
    if torch.device(device).type == "cpu":
        return
    out_bytes = math.prod(case.shape("q")) * BY_NAME[case.dtype].itemsize
    prime_allocator((out_bytes, case.batch * case.heads * case.seq_q * 4), device, byte)


# -- running ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Pending:
    """What a launched run still has on the device: its check flags and outputs, read back
    together with other runs' (`deliver`), and how to read the flags."""
    flags: torch.Tensor | None              # input-mutation flags, then the canaries' (if guarded);
                                            # None for a run whose side effects are not judged
    inputs_flags: int                       # how many of `flags` are about the inputs
    per_storage: bool                       # one flag per storage (else one for all, packed)
    before: dict                            # what the storages are compared with
    guarded: bool
    here: torch.device


@dataclasses.dataclass
class Run:
    call: execute.Call                      # the outputs where the implementation left them
    inputs: Inputs
    failure: Verdict | None = None          # crash or contract: nothing else can be judged
    side_effects: list[Verdict] = dataclasses.field(default_factory=list)
    delivered: tuple | None = None          # (device, out, lse): the outputs where they are judged
    pending: Pending | None = None          # launched, not yet read back (deliver)

    @property
    def out(self):
        return self.call.out

    @property
    def lse(self):
        return self.call.lse


def crash(impl, case, summary: str) -> Verdict:
    return Verdict(impl=impl.name, case=case, check="crash", passed=False, detail=summary)


def launch(impl: Implementation, case: AttentionCase, device, *, adversarial: bool,
           pad_value: float = float("nan"), poison: bool = True, inputs: Inputs | None = None,
           pristine: Inputs | None = None, here: torch.device | None = None,
           side_effects: bool = True) -> Run:
    """Call `impl` once and queue its checks, without waiting for the device: the run's flags
    and outputs are read back by `deliver`, possibly together with another run's.
    `side_effects=False`: only the outputs are wanted (the judgement's second run, whose input
    mutation the first run's check already covers): no flags, no side-effect verdicts.

    The call is not synchronised on its own (every wait costs a turn of a shared GPU): an
    asynchronous device fault surfaces in the read-back, which `deliver` turns into this run's
    crash."""
    if inputs is None:
        inputs = materialize(case, device, pad_value=pad_value)
        before = inputs.snapshot() if side_effects else None
    else:
        before = (None if not side_effects else
                  pristine.storages if pristine is not None else inputs.snapshot())
    guarded = None
    buffers = {}
    if adversarial and impl.caps.out_buffer:
        guarded = (GuardedBuffer(case.shape("q"), inputs.q.dtype, device),
                   GuardedBuffer((case.batch, case.heads, case.seq_q), torch.float32, device))
        if not poison:
            for g in guarded:
                g.tensor.zero_()
        buffers = dict(out=guarded[0].tensor, lse=guarded[1].tensor)
    elif adversarial:
        prime_for_outputs(case, device, 0xFF if poison else 0x00)
    verdict = dict(impl=impl.name, case=case)
    if adversarial:
        memory = adversarial_memory(poison, impl.caps.compiles_per_shape)
    else:
        memory = contextlib.nullcontext()
    with memory:
        call = execute.call(impl, *inputs.tensors(), case, synchronize=False, **buffers)
    run = Run(call, inputs)
    if call.status == execute.REFUSED and not call.declared_refusal:
        run.failure = Verdict(check="crash", passed=False,
                              detail=f"refused a declared case: {call.summary}", **verdict)
    elif call.status in (execute.CRASH, execute.CONTRACT):
        run.failure = Verdict(check=call.status, passed=False, detail=call.summary,
                              origin=call.origin, **verdict)
    if not call.answered:
        return run
    if call.lse is None and impl.caps.returns_lse:
        run.failure = Verdict(check="contract", passed=False,
                              detail="declares returns_lse but returned no lse", **verdict)
        return run
    if not side_effects:
        run.pending = Pending(None, 0, False, {}, False, torch.device(here or device))
        return run
    try:
        # Packed inputs (moved to an accelerator) are compared whole, one kernel; which storage
        # changed is asked only when something did.
        anywhere = changed_anywhere(inputs, pristine) if pristine is not None else None
        flags = changed_flags(inputs.storages, before) if anywhere is None else anywhere
        inputs_flags = flags.numel()
        if guarded is not None:
            flags = torch.cat([flags, torch.stack([g.canary_broken() for g in guarded])])
    except Exception as exc:           # a launch in a context the call just faulted
        run.failure = crash(impl, case, execute.one_line(exc))
        return run
    run.pending = Pending(flags, inputs_flags, anywhere is None, before, guarded is not None,
                          torch.device(here or device))
    return run


def deliver(impl: Implementation, case: AttentionCase, runs: list[Run], also=()) -> list | None:
    """Read back every pending run's flags and outputs in one transfer (transfer.read_back),
    then turn the flags into the runs' side-effect verdicts. A device fault raised by the
    read-back is the first pending run's crash (the runs were launched in order, so nothing of
    the harness ran between them). The runs deliver to one place (`here` of their launches).
    `also`: more tensors read back in the same transfer (the references computed between the
    runs, judge.py), returned on `here` in their order; None when the read-back failed."""
    pending = [r for r in runs if r.pending is not None]
    if not pending:
        return None if also else []     # no run says where `also` would go
    here = pending[0].pending.here
    if any(r.pending.here != here for r in pending):
        raise ValueError(f"runs delivered together must be judged in one place, not "
                         f"{sorted({str(r.pending.here) for r in pending})}")
    tensors = [t for r in pending for t in (r.pending.flags, r.call.out, r.call.lse)]
    try:
        back = read_back(tensors + list(also), here)
        flag_lists = [None if back[3 * i] is None else back[3 * i].tolist()
                      for i in range(len(pending))]
    except Exception as exc:           # an asynchronous fault of a kernel, surfacing here
        summary = execute.one_line(exc)
        execute.end_on_device_fault(impl, case, "forward", summary, pending[0].inputs.q.device)
        pending[0].failure = crash(impl, case, summary)
        for r in pending:
            r.pending = None
        return None
    verdict = dict(impl=impl.name, case=case)
    for i, (r, flags) in enumerate(zip(pending, flag_lists)):
        p, r.pending = r.pending, None
        r.delivered = (here, back[3 * i + 1], back[3 * i + 2])
        if flags is None:           # launched with side_effects=False
            continue
        if p.per_storage:
            changed = [name for name, flag in zip(r.inputs.storages, flags) if flag]
        elif flags[0]:
            per_storage = changed_flags(r.inputs.storages, p.before).tolist()
            changed = [name for name, flag in zip(r.inputs.storages, per_storage) if flag]
            changed = changed or ["the bytes between the input storages"]
        else:
            changed = []
        r.side_effects.append(Verdict(
            check="inputs_mutated", passed=not changed,
            detail=f"storage of {', '.join(changed)} changed" if changed else "", **verdict))
        if p.guarded:
            broken = [name for name, flag in zip(("out", "lse"), flags[p.inputs_flags:]) if flag]
            r.side_effects.append(Verdict(
                check="out_of_bounds_write", passed=not broken,
                detail=(f"canary next to the {', '.join(broken)} buffer overwritten"
                        if broken else ""), **verdict))
    return back[len(tensors):]


def run(impl: Implementation, case: AttentionCase, device, **kw) -> Run:
    """One call of `impl` (`launch`'s arguments), its flags and outputs read back: on freshly
    materialised inputs, or on `inputs`, a copy of `pristine` made for this run and used by no
    other, whose storages the input-mutation check compares against (no snapshot needed). The
    outputs are also delivered to `here`, where the judgement computes (default: `device`)."""
    launched = launch(impl, case, device, **kw)
    deliver(impl, case, [launched])
    return launched


def same_bits(pairs) -> list[bool]:
    """For each (a, b): the same shape and bits (True when either is None). Off the CPU the
    answers are read back together, one wait for the device instead of one per pair."""
    answers = {}
    compared = []
    for i, (a, b) in enumerate(pairs):
        if a is None or b is None:
            answers[i] = True
        elif a.shape != b.shape or a.dtype != b.dtype:
            answers[i] = False
        elif a.device.type == "cpu":
            answers[i] = torch.equal(as_bits(a), as_bits(b))
        else:
            compared.append((i, (as_bits(a) != as_bits(b)).any()))
    if compared:
        for (i, _), differs in zip(compared, torch.stack([d for _, d in compared]).tolist()):
            answers[i] = not differs
    return [answers[i] for i in range(len(pairs))]
