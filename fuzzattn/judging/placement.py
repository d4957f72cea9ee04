"""Where a judgement's own arithmetic runs: the float64 oracle, the same-precision reference and
every comparison of their results with the implementation's.

The implementation always runs on the case's device. On an accelerator a small case is judged on
the host: its outputs come back in one copy and the oracle, the reference and the checks (a few
hundred small tensor operations) run on the CPU, instead of as many kernel launches and
synchronisations, each of which waits for this process's time slice when several processes share
the GPU. HOST_JUDGE_MACS bounds those cases by B * Hq * Nq * Nk * D (FUZZATTN_HOST_JUDGE_MACS
overrides it; 0 judges every case on its own device).

A larger case whose outputs are still small (B * Hq * max(Nq, Nk) * D <= HOST_CHECK_ELEMENTS) is
judged half and half: the references' matmuls run on the device, where float64 is fast, and come
back in one copy (`moved_together`) beside the implementation's outputs; the checks run on the
host (FUZZATTN_HOST_CHECK_ELEMENTS overrides the bound; 0 checks every larger case on the
device). Either way the oracle is float64 attention of the same input bits.
"""
from __future__ import annotations

import dataclasses
import os

import torch

from fuzzattn.contract.case import AttentionCase
from fuzzattn.inputs.transfer import read_back, same_device

# ~0.1 ms per float64 matmul on one CPU core; about 64% of the gpu profile's sdpa cases
HOST_JUDGE_MACS = 2 ** 21
ENV = "FUZZATTN_HOST_JUDGE_MACS"
# the fastest of 2^17..2^21 for 16 sdpa fuzzers sharing one GPU (docs/CALIBRATION.md#host-judging)
HOST_CHECK_ELEMENTS = 2 ** 19
CHECK_ENV = "FUZZATTN_HOST_CHECK_ELEMENTS"


def _setting(env: str, default: int, unit: str) -> int:
    value = os.environ.get(env)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{env}={value!r} is not an integer ({unit}; 0 disables)") from None
    if number < 0:
        raise ValueError(f"{env}={value!r} must be >= 0 ({unit}; 0 disables)")
    return number


def host_judge_macs() -> int:
    return _setting(ENV, HOST_JUDGE_MACS, "multiply-adds")


def host_check_elements() -> int:
    return _setting(CHECK_ENV, HOST_CHECK_ELEMENTS, "elements")


def judge_device(case: AttentionCase, device) -> torch.device:
    """The device the references of `case` (the float64 oracle, the same-precision reference and
    their gradient versions) compute on when its implementation ran on `device`."""
    device = torch.device(device)
    if device.type == "cpu":
        return device
    return torch.device("cpu") if case.macs <= host_judge_macs() else device


def check_device(case: AttentionCase, device) -> torch.device:
    """The device the checks of `case` compute on (where the runs deliver their outputs and the
    references are read back to): the host when the references are computed there, or when the
    outputs and gradients are small enough to judge there (module docstring)."""
    references = judge_device(case, device)
    if references.type == "cpu":
        return references
    elements = case.batch * case.heads * max(case.seq_q, case.seq_k) * case.head_dim
    return torch.device("cpu") if elements <= host_check_elements() else references


def judging():
    """How a judgement's own arithmetic runs: the references and the checks need no autograd,
    and run in inference mode, where every torch operation skips autograd's dispatch and version
    counting (measured on the CPU: ~250 small operations a judged sdpa case). Never the
    implementation's own runs: a kernel that keeps tensors across calls (a cached mask, a
    workspace) would keep inference tensors, and its next autograd call would fail on them
    ("Inference tensors cannot be saved for backward"), a crash of the harness's making
    (tests/gradients/test_gradients.py pins it)."""
    return torch.inference_mode()


def moved_together(references: list, device: torch.device) -> list:
    """`references` (oracle.Reference, gradients.reference_gradients.GradReference: dataclasses holding tensors,
    dicts and dataclasses of tensors) with every tensor on `device`, those elsewhere read back in
    one copy; a 0-d tensor (a score magnitude computed without waiting for it) becomes a float."""
    return rebuilt(references, read_back(tensors_in(references), device))


def tensors_in(references: list) -> list[torch.Tensor]:
    """Every tensor `references` hold, in the order `rebuilt` takes them back (a read-back of
    them may carry other tensors too: engine/runs.deliver)."""
    found: list[torch.Tensor] = []

    def collect(x):
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif dataclasses.is_dataclass(x):
            for field in dataclasses.fields(x):
                collect(getattr(x, field.name))
        elif isinstance(x, dict):
            for value in x.values():
                collect(value)

    for r in references:
        collect(r)
    return found


def rebuilt(references: list, tensors) -> list:
    """`references` with their tensors (tensors_in's order) replaced by `tensors`, a 0-d one
    read as a float."""
    here = iter(tensors)

    def rebuild(x):
        if isinstance(x, torch.Tensor):
            t = next(here)
            return float(t) if t.dim() == 0 else t
        if dataclasses.is_dataclass(x):
            return dataclasses.replace(x, **{f.name: rebuild(getattr(x, f.name))
                                             for f in dataclasses.fields(x)})
        if isinstance(x, dict):
            return {key: rebuild(value) for key, value in x.items()}
        return x

    return [rebuild(r) for r in references]


def moved(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """`t` on `device` (itself when already there); None stays None."""
    return t if t is None or same_device(t.device, device) else t.to(device)
