"""Where a judgement's own arithmetic runs: the float64 oracle, the same-precision reference and
every comparison of their results with the implementation's.

The implementation always runs on the case's device. On an accelerator, a small case is judged
on the host instead: its outputs are copied back once, and the oracle, the reference and the
checks (a few hundred small tensor operations) run on the CPU rather than as as many kernel
launches and synchronisations on the GPU. Measured on the H200 (benchmarks/gpu_probe.sh): one
fuzzing process keeps the GPU about 10% busy, yet 16 concurrent ones scaled to only 2.2x one
(59.8 -> 129 sdpa cases/s) with the GPU reported 99% busy: processes without MPS share the GPU
by time-slicing between their contexts, and every tiny judging kernel and synchronisation costs
a context switch. (MPS would let their kernels overlap, but a fatal fault in one MPS client is
delivered to every client on that GPU, which would turn one kernel's device fault into false
verdicts of other kernels: not for a fuzzer.)

HOST_JUDGE_MACS bounds the cases judged on the host by B * Hq * Nq * Nk * D, the multiply-adds
of one attention matmul: 2^21 is about 0.1 ms per float64 matmul on one CPU core (30 GFLOP/s
measured), and about 64% of the `gpu` profile's sdpa cases (600 drawn). Larger cases stay on
the device, where float64 is fast. FUZZATTN_HOST_JUDGE_MACS overrides it (0: judge every case
on its own device). Either way the oracle is float64 attention of the same input bits; results
agree to float64 rounding, far below every tolerance.
"""
from __future__ import annotations

import os

import torch

from fuzzattn.contract.case import AttentionCase
from fuzzattn.engine.transfer import same_device

HOST_JUDGE_MACS = 2 ** 21
ENV = "FUZZATTN_HOST_JUDGE_MACS"


def host_judge_macs() -> int:
    value = os.environ.get(ENV)
    if value is None or value == "":
        return HOST_JUDGE_MACS
    try:
        macs = int(value)
    except ValueError:
        raise ValueError(f"{ENV}={value!r} is not an integer (multiply-adds; 0 disables)") from None
    if macs < 0:
        raise ValueError(f"{ENV}={value!r} must be >= 0 (multiply-adds; 0 disables)")
    return macs


def judge_device(case: AttentionCase, device) -> torch.device:
    """The device the judgement of `case` computes on when its implementation ran on `device`."""
    device = torch.device(device)
    if device.type == "cpu":
        return device
    macs = case.batch * case.heads * case.seq_q * max(case.seq_k, 1) * case.head_dim
    return torch.device("cpu") if macs <= host_judge_macs() else device


def moved(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """`t` on `device` (itself when already there); None stays None."""
    return t if t is None or same_device(t.device, device) else t.to(device)
