"""Tensors between host and accelerator in one copy (fuzzattn/inputs/transfer.py), and inputs that
live in a packed buffer keep their bits, views and NaN surroundings."""
from __future__ import annotations

import importlib
import pytest
import torch

from fuzzattn import AttentionCase
from fuzzattn.inputs.materialize import (Inputs, _moved, _viewed, as_bits, changed_anywhere, changed_flags,
                                     materialize)
from fuzzattn.inputs.transfer import ALIGN, FILL, packed, read_back, unpacked

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


def _packed_on_cpu(inputs: Inputs) -> Inputs:
    """`inputs` as an accelerator holds them (one packed buffer, storages as views of it),
    moved on the CPU so the packed paths run without a GPU."""
    return _moved(inputs, torch.device("cpu"))


def test_packed_inputs_copy_in_one_buffer_and_compare_whole():
    case = AttentionCase(batch=2, heads=2, kv_heads=1, seq_q=5, seq_k=9, head_dim=24,
                         layout=("transposed", "sliced", "broadcast_batch"))
    pristine = _packed_on_cpu(materialize(case, "cpu"))
    copy = pristine.copy()
    assert copy.packed is not None and copy.packed.data_ptr() != pristine.packed.data_ptr()
    for name, storage in copy.storages.items():       # every storage lies in the new buffer
        start = storage.data_ptr() - copy.packed.data_ptr()
        assert 0 <= start and start + storage.numel() * storage.element_size() <= copy.packed.numel()
        assert torch.equal(as_bits(storage), as_bits(pristine.storages[name]))
    for a, b in zip(copy.tensors(), pristine.tensors()):
        assert a.stride() == b.stride() and torch.equal(as_bits(a), as_bits(b))
    assert changed_anywhere(copy, pristine).tolist() == [False]
    copy.k[0, 0, 3, 1] += 1                           # a write into an input
    assert changed_anywhere(copy, pristine).tolist() == [True]
    assert changed_flags(copy.storages, pristine.storages).tolist() == [False, True, False]
    gap = pristine.copy()                             # a write between storages only
    q = gap.storages["q"]
    end = q.data_ptr() - gap.packed.data_ptr() + q.numel() * q.element_size()
    assert end % ALIGN, "the case must leave a gap after q's storage"
    gap.packed[end] = 0
    assert changed_anywhere(gap, pristine).tolist() == [True]
    assert not any(changed_flags(gap.storages, pristine.storages).tolist())
    assert changed_anywhere(materialize(case, "cpu"), pristine) is None      # not packed


def test_the_judge_names_the_mutated_storage_of_packed_inputs(monkeypatch):
    """The whole-buffer comparison says only that something changed; the verdict still names
    the storage (k), and an implementation that writes nothing passes."""
    judge_module = importlib.import_module("fuzzattn.judgement.judge")
    from fuzzattn import Implementation, judge
    from fuzzattn.kernels.sdpa import sdpa_forward

    real = judge_module.materialize
    monkeypatch.setattr(judge_module, "materialize",
                        lambda case, device, **kw: _packed_on_cpu(real(case, device, **kw)))

    def scribbles(q, k, v, *, causal, scale):
        out = sdpa_forward(q, k, v, causal=causal, scale=scale)
        k[0, 0, 0, 0] = 0.0
        return out

    case = AttentionCase(batch=1, heads=2, kv_heads=2, seq_q=7, seq_k=11, head_dim=16)
    mutated = judge(Implementation("scribbles", scribbles), case, device="cpu", gradients=False)
    verdict = next(v for v in mutated.verdicts if v.check == "inputs_mutated")
    assert not verdict.passed and verdict.detail == "storage of k changed"
    clean = judge(Implementation("clean", lambda q, k, v, *, causal, scale:
                                 sdpa_forward(q, k, v, causal=causal, scale=scale)), case,
                  device="cpu", gradients=False)
    assert clean.passed and any(v.check == "inputs_mutated" for v in clean.verdicts)
