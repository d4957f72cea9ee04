"""Where a case's random values come from: its `generator` field names one of two sources.

torch_cpu  a CPU `torch.Generator(data_seed)`: `torch.randn` and friends. Every case drawn before
           the field existed, and every case of the CPU profiles. Values are born on the CPU and
           moved to the device; the same bits on every machine because the CPU computes them.
counter    a counter-based generator in integer torch operations: value i of a stream is a hash
           of (seed, i), so any device computes it, in parallel, to the same bits. The GPU
           profiles give it to their cases (profiles.Profile.device_values_macs): their inputs
           are born on the device, where the CPU's randn of a large case cost milliseconds per
           case (~13% of a judged sdpa case's host time on the H200, benchmarks/THROUGHPUT.md).

The counter stream is SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014): state_i = base + i * 0x9E3779B97F4A7C15, output = mix(state_i), in
int64 arithmetic that wraps on every torch device. Why the bits agree across devices:
- every step is an integer add, multiply, xor, shift or mask (wrapping two's complement on the CPU
  and on CUDA; `>>` is arithmetic on int64, so each right shift is masked back to a logical one);
- a normal value is the sum of the output's four 16-bit fields (Irwin-Hall, n = 4: mean 131070,
  standard deviation sqrt((2^32 - 1) / 3) ~ 37837.2, support +-3.46 sigma), centred as an integer
  below 2^24, so its conversion to float32 is exact, then multiplied by a float32 constant:
  one correctly rounded IEEE product, the same on every device;
- rounding to bf16/fp16 afterwards is round-to-nearest-even on the CPU and on CUDA alike.
tests/test_value_sources.py pins values on the CPU; its GPU test compares CPU and CUDA bits.
On the CPU the counter costs ~20 ns a value against randn's ~4 (measured here), which is why the
CPU profiles keep torch_cpu.

On a CUDA device the normal values come from one Triton kernel (`_normals_kernel`) doing the same
integer steps in uint64 registers: the torch version is ~27 elementwise kernels over int64
tensors, 16-24 bytes of memory traffic per value each, ~5 ms of GPU time for the gpu profile's
largest case, on a GPU that 16 fuzzers already keep busy (benchmarks/THROUGHPUT.md, call 42).
The kernel writes 4 bytes per value. Same bits: the GPU test compares it with the CPU's torch
version, and test_value_sources runs it under Triton's interpreter on the CPU as well.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from fuzzattn.contract.case import GENERATORS

GOLDEN = 0x9E3779B97F4A7C15          # the SplitMix64 increment (2^64 / golden ratio, odd)
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1

# Irwin-Hall of four 16-bit fields: centre and the float32 factor to unit variance.
_CENTRE = 2 * 0xFFFF           # 131070
_UNIT = float(np.float32(1.0 / math.sqrt(((1 << 32) - 1) / 3)))   # float32-exact Python float


def _signed(x: int) -> int:
    """A 64-bit pattern as the int64 torch stores it."""
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


def mix_int(x: int) -> int:
    """SplitMix64's finaliser on a Python int (the stream's base from a seed)."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * MIX1) & _MASK64
    x = ((x ^ (x >> 27)) * MIX2) & _MASK64
    return x ^ (x >> 31)


def _mix_(x: torch.Tensor) -> torch.Tensor:
    """The same finaliser, in place on an int64 tensor (right shifts masked to logical ones)."""
    x.bitwise_xor_((x >> 30) & ((1 << 34) - 1))
    x.mul_(_signed(MIX1))
    x.bitwise_xor_((x >> 27) & ((1 << 37) - 1))
    x.mul_(_signed(MIX2))
    x.bitwise_xor_((x >> 31) & ((1 << 33) - 1))
    return x


class CounterSource:
    """Successive draws from one SplitMix64 stream on `device`: each draw takes the next block of
    counters, so a sequence of draws gives the same bits wherever it runs."""

    def __init__(self, seed: int, device="cpu"):
        self.base = mix_int(seed)
        self.device = torch.device(device)
        self.position = 0

    def bits(self, n: int) -> torch.Tensor:
        """(n,) int64: the next n outputs of the stream."""
        counters = torch.arange(self.position, self.position + n, dtype=torch.int64,
                                device=self.device)
        self.position += n
        counters.mul_(_signed(GOLDEN)).add_(_signed(self.base))
        return _mix_(counters)

    def normal(self, shape) -> torch.Tensor:
        """float32 values of mean 0 and variance 1 (Irwin-Hall, n = 4: module docstring)."""
        n = math.prod(shape)
        if self.device.type == "cuda" and n and _fused_here(self.device):
            out = torch.empty(n, dtype=torch.float32, device=self.device)
            fused_normals(out, self.position, self.base)
            self.position += n
            return out.view(shape)
        h = self.bits(n)
        total = h & 0xFFFF
        for shift in (16, 32, 48):
            total.add_((h >> shift) & 0xFFFF)
        return total.sub_(_CENTRE).to(torch.float32).mul_(_UNIT).view(shape)

    def integers(self, low: int, high: int, shape) -> torch.Tensor:
        """int64 values in [low, high), each the stream's top 62 bits modulo the range (bias
        below 2^-40 for the ranges cases use)."""
        h = (self.bits(math.prod(shape)) >> 2) & ((1 << 62) - 1)
        return h.remainder_(high - low).add_(low).view(shape)

    def coin(self, shape) -> torch.Tensor:
        """bool values, each true with probability 1/2."""
        return ((self.bits(math.prod(shape)) >> 40) & 1).bool().view(shape)


BLOCK = 1024


def fused_normals(out: torch.Tensor, position: int, base: int) -> None:
    """Fill `out` (float32, contiguous, 1-D) with the stream's normal values from counter
    `position`: what CounterSource.normal computes, in one Triton kernel."""
    import triton
    n = out.numel()
    _normals_kernel()[(triton.cdiv(n, BLOCK),)](
        out, n, position, _signed(base), _signed(GOLDEN), _signed(MIX1), _signed(MIX2), _UNIT,
        BLOCK=BLOCK)


@functools.lru_cache(maxsize=None)
def _fused_here(device: torch.device) -> bool:
    """Whether the fused kernel serves `device` in this process: compiled Triton (not the
    interpreter), and checked once against the torch version on 4,099 values of a stream that
    crosses a 2^32 counter boundary. A kernel that fails to build or disagrees leaves the torch
    version in charge (the same bits, more launches), said once on stderr."""
    from fuzzattn.triton_interpreter.backend import is_interpreted
    if is_interpreted():
        return False
    import sys
    probe = CounterSource(0x5EED, "cpu")
    probe.position = 2**32 - 2048
    try:
        out = torch.empty(4099, dtype=torch.float32, device=device)
        fused_normals(out, probe.position, probe.base)
        same = torch.equal(out.cpu().view(torch.int32), probe.normal((4099,)).view(torch.int32))
    except Exception as exc:               # no working Triton for this device
        print(f"fuzzattn: counter values by torch operations on {device}: the fused kernel "
              f"failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
              file=sys.stderr)
        return False
    if not same:
        print(f"fuzzattn: counter values by torch operations on {device}: the fused kernel's "
              "bits differ from theirs", file=sys.stderr)
    return same


@functools.lru_cache(maxsize=1)
def _normals_kernel():
    """Decorated on first use, so that it honours the backend triton_backend chose."""
    import triton
    import triton.language as tl

    @triton.jit
    def counter_normals(out_ptr, n, position, base, golden, mix1, mix2, unit, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        # Integer arguments arrive as int32 or int64 by their value: widened with their sign,
        # then read as uint64, whose products wrap and whose shifts are logical.
        u64 = tl.uint64
        x = (offsets + position).to(tl.int64).to(u64, bitcast=True)
        x = x * golden.to(tl.int64).to(u64, bitcast=True) + base.to(tl.int64).to(u64, bitcast=True)
        x = (x ^ (x >> 30)) * mix1.to(tl.int64).to(u64, bitcast=True)
        x = (x ^ (x >> 27)) * mix2.to(tl.int64).to(u64, bitcast=True)
        x = x ^ (x >> 31)
        total = (x & 0xFFFF) + ((x >> 16) & 0xFFFF) + ((x >> 32) & 0xFFFF) + (x >> 48)
        value = (total.to(tl.int64, bitcast=True) - 131070).to(tl.float32) * unit
        tl.store(out_ptr + offsets, value, mask=offsets < n)

    return counter_normals


class CpuSource:
    """The CPU torch.Generator draws every case made before counters: the same calls in the same
    order as before, so every saved case keeps its bits."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def normal(self, shape) -> torch.Tensor:
        return torch.randn(shape, generator=self.generator)

    def integers(self, low: int, high: int, shape) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=self.generator)

    def coin(self, shape) -> torch.Tensor:
        return torch.rand(shape, generator=self.generator) < 0.5


def source(generator: str, seed: int, device="cpu"):
    """The source a case's `generator` names, seeded with `seed`; a counter source computes on
    `device`, a CPU source always on the CPU."""
    if generator == "counter":
        return CounterSource(seed, device)
    if generator == "torch_cpu":
        return CpuSource(seed)
    raise ValueError(f"generator={generator!r} is not one of {GENERATORS}")
