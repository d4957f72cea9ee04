"""How a process waits for the GPU (fuzzattn/engine/cuda_waits.py): opt-in, reported, never raised."""
from __future__ import annotations

import torch

from fuzzattn.engine import cuda_waits


def test_it_is_opt_in(monkeypatch):
    monkeypatch.delenv(cuda_waits.ENV, raising=False)
    assert not cuda_waits.requested()
    for value, asked in (("1", True), ("0", False), ("", False)):
        monkeypatch.setenv(cuda_waits.ENV, value)
        assert cuda_waits.requested() is asked


def test_the_request_is_reported_not_raised():
    said = cuda_waits.block_while_waiting()
    assert said.startswith("blocking sync: ")
    if not torch.cuda.is_available():
        assert said == "blocking sync: no CUDA"
