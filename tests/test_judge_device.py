"""Where a judgement computes (fuzzattn/engine/judge_device.py): small cases on an accelerator are
judged on the host, large ones on the device, CPU cases on the CPU; the override is checked."""
from __future__ import annotations

import pytest
import torch

from fuzzattn import AttentionCase
from fuzzattn.engine.judge_device import ENV, HOST_JUDGE_MACS, judge_device, moved

SMALL = AttentionCase(1, 2, 2, 16, 32, 64)                # 65,536 multiply-adds
LARGE = AttentionCase(4, 16, 4, 300, 300, 128)            # 737,280,000


def test_cpu_cases_are_judged_on_the_cpu_whatever_their_size():
    assert judge_device(LARGE, "cpu") == torch.device("cpu")


def test_small_accelerator_cases_are_judged_on_the_host_large_ones_on_the_device(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    # A device torch.device accepts without it being present: nothing is allocated on it.
    assert judge_device(SMALL, "cuda") == torch.device("cpu")
    assert judge_device(LARGE, "cuda") == torch.device("cuda")
    edge = AttentionCase(1, 1, 1, 1, HOST_JUDGE_MACS // 64, 64)
    assert judge_device(edge, "cuda") == torch.device("cpu")
    assert judge_device(edge.replace(seq_q=2), "cuda") == torch.device("cuda")
    # No keys still costs the oracle a pass over the queries: counted as one key.
    assert judge_device(SMALL.replace(seq_k=0), "cuda") == torch.device("cpu")


def test_the_override(monkeypatch):
    monkeypatch.setenv(ENV, "0")
    assert judge_device(SMALL, "cuda") == torch.device("cuda")
    monkeypatch.setenv(ENV, str(10 ** 12))
    assert judge_device(LARGE, "cuda") == torch.device("cpu")
    for bad in ("many", "-1"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=f"{ENV}='{bad}'"):
            judge_device(SMALL, "cuda")


def test_moved_keeps_values_and_none():
    t = torch.arange(6.0).reshape(2, 3).t()
    assert moved(t, torch.device("cpu")) is t
    assert moved(None, torch.device("cpu")) is None
