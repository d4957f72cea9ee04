"""Allocator priming (fuzzattn/inputs/nan_fill.py): the blocks handed to the allocator hold the
requested byte everywhere, so memory a kernel never writes reads as NaN (0xFF) or as 0."""
from __future__ import annotations

import pytest
import torch

from fuzzattn.inputs.nan_fill import POISON_BLOCKS, filled_blocks, prime_allocator

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("byte", [0xFF, 0x00])
def test_every_block_of_every_size_holds_the_byte(device, byte):
    blocks = filled_blocks((1000, 0, 37), device, byte)
    assert [b.numel() for b in blocks] == [1000] * POISON_BLOCKS + [37] * POISON_BLOCKS
    assert all(bool((b == byte).all()) for b in blocks)
    assert filled_blocks((0,), device, byte) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA's caching allocator")
def test_a_freed_block_comes_back_nan_from_the_caching_allocator():
    size = 4096 * 4
    prime_allocator((size,), "cuda", 0xFF)
    reused = torch.empty(size // 4, dtype=torch.float32, device="cuda")
    assert bool(torch.isnan(reused).all())
