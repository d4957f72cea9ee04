"""Tensors between host and accelerator in one copy (fuzzattn/engine/transfer.py), and inputs that
live in a packed buffer keep their bits, views and NaN surroundings."""
from __future__ import annotations

import pytest
import torch

from fuzzattn import AttentionCase
from fuzzattn.engine.inputs import Inputs, _viewed, as_bits, materialize
from fuzzattn.engine.transfer import ALIGN, FILL, packed, read_back, unpacked

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: moves host <-> GPU")


def _mixed():
    return [torch.randn(3, 5, dtype=torch.float64), torch.tensor([True, False, True]),
            torch.randn(7).to(torch.bfloat16), torch.empty(0, 4), torch.randn(2, 3).t(),
            torch.full((1,), float("-inf"))]


def test_packing_keeps_bits_shapes_and_alignment_and_fills_the_gaps_with_nan_bytes():
    tensors = _mixed()
    buffer, offsets = packed(tensors)
    assert all(o % ALIGN == 0 for o in offsets) and buffer.dtype == torch.uint8
    for got, want in zip(unpacked(buffer, tensors, offsets), tensors):
        assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
        assert torch.equal(got.reshape(-1).view(torch.uint8), want.contiguous().reshape(-1).view(torch.uint8))
    # The gap after the first tensor (15 float64 = 120 bytes) up to the next boundary is 0xFF.
    assert bool((buffer[120:ALIGN] == FILL).all())
    assert torch.isnan(buffer[120:120 + 8].view(torch.float64)).all()


def test_views_over_a_packed_storage_read_the_same_values():
    case = AttentionCase(2, 2, 1, 5, 7, 24, layout=("sliced", "transposed", "broadcast_heads"))
    inputs = materialize(case)
    buffer, offsets = packed(list(inputs.storages.values()))
    storages = dict(zip(inputs.storages, unpacked(buffer, list(inputs.storages.values()), offsets)))
    moved = _viewed(inputs, storages, host=inputs)
    for got, want in zip(moved.tensors(), inputs.tensors()):
        assert got.stride() == want.stride() and torch.equal(as_bits(got), as_bits(want))
    assert moved.on(torch.device("cpu")) is moved         # already there
    assert isinstance(moved.copy(), Inputs) and moved.copy().host is inputs


def test_reading_back_what_is_already_here_changes_nothing():
    a, b = torch.randn(3), torch.randn(2, 2)
    got = read_back([a, None, b], "cpu")
    assert got[0] is a and got[1] is None and got[2] is b


@CUDA
def test_inputs_move_in_one_copy_and_keep_their_host_copy():
    case = AttentionCase(1, 2, 2, 9, 33, 40, dtype="float16", layout=("transposed", "sliced", "contiguous"))
    host = materialize(case)
    on_gpu = materialize(case, "cuda")
    assert on_gpu.q.is_cuda and on_gpu.host is not None and not on_gpu.host.q.is_cuda
    assert on_gpu.on(torch.device("cpu")) is on_gpu.host
    for got, want in zip(on_gpu.tensors(), host.tensors()):
        assert got.stride() == want.stride() and torch.equal(as_bits(got.cpu()), as_bits(want))
    for storage in on_gpu.storages.values():
        assert storage.data_ptr() % ALIGN == 0
    copy = on_gpu.copy()
    assert all(torch.equal(as_bits(a), as_bits(b)) for a, b in zip(copy.tensors(), on_gpu.tensors()))


@CUDA
def test_reading_back_from_the_gpu_is_one_copy_with_the_same_bits():
    flags = torch.tensor([False, True], device="cuda")
    out = torch.randn(2, 3, 4, device="cuda").to(torch.bfloat16).transpose(1, 2)
    lse = torch.full((2, 3), float("-inf"), device="cuda")
    got = read_back([flags, out, None, lse], "cpu")
    assert got[0].tolist() == [False, True] and got[2] is None
    assert torch.equal(as_bits(got[1]), as_bits(out.cpu().contiguous())) and got[1].shape == out.shape
    assert torch.equal(got[3], lse.cpu())
