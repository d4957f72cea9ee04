"""Where a case's random values come from: its `generator` field names one of two sources.

torch_cpu  a CPU `torch.Generator(data_seed)`: `torch.randn` and friends. Every case drawn before
           the field existed, and every case of the CPU profiles. Values are born on the CPU and
           moved to the device; the same bits on every machine because the CPU computes them.
counter    a counter-based generator in integer torch operations: value i of a stream is a hash
           of (seed, i), so any device computes it, in parallel, to the same bits. The GPU
           profiles give it to their cases (profiles.Profile.device_values_macs): their inputs
           are born on the device, where the CPU's randn of a large case cost milliseconds per
           case.

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
tests/inputs/test_value_sources.py pins values on the CPU; its GPU test compares CPU and CUDA bits.
On the CPU the counter costs ~20 ns a value against randn's ~4 (measured here), which is why the
CPU profiles keep torch_cpu.

On a CUDA device the normal values come from one Triton kernel (`_normals_kernel`) doing the same
integer steps in uint64 registers: the torch version is ~27 elementwise kernels over int64
tensors, 16-24 bytes of memory traffic per value each, ~5 ms of GPU time for the gpu profile's
largest case, on a GPU that 16 fuzzers already keep busy.
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
    """Decorated on first use, so that it honours the backend triton_interpreter.backend chose."""
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


# -- value profiles built from a source's draws (materialize applies them by name) -------------
# Each takes the case and its standard normal q, k, v (float32, logical shapes) and the source
# they came from, and returns the profile's q, k, v, to be rounded to the case's dtype. A choice
# made per case (not per element) comes from the data seed through `mix_int`, on the host: the
# same on every device, with nothing read back from one.

def _per_case(case, salt: int, n: int) -> int:
    """A choice among n, fixed by the case's data seed (`salt` keeps choices independent)."""
    return mix_int(case.data_seed ^ salt) % n


# exact_mean: q = 0, so every visible key weighs exactly 1 and a row's output is the mean of the
# values it sees; v is one value c per batch and kv head, of 8 significant bits, |c| in
# [1/16, 1/4). Every output is then c exactly, in every dtype, whatever
# keys a row sees, and a correct kernel is exact (sums of c stay within fp32's 24 bits, the
# division by the count is exact); the oracle and the reference are too. The running sums n c a
# tiled kernel carries need up to 15 bits: rounded to bf16 (8) or fp16 (11) they err, so a
# kernel that keeps its running state in the input dtype (the accumulator, the P V products of a
# block) is off by a rounding where the reference's error is 0: no rounding of the reference's
# own to hide in, in a row of any length (a running state rounded once per key block is
# otherwise the reference's rounding again, a few tenths past it at the CPU's lengths). One c for
# every column makes the error all or nothing across a row: where the running sums round the
# output off c, every element is off by the same ulp, several times the statistic's allowance
# for one element off, also in the smallest case a shrinker finds.
# |c| < FLOOR keeps the max rule's absolute allowance above such an error: it is the statistic's
# to see (fuzzattn/judging/error_statistics.py). fp32 cases keep standard normal v: an fp32
# output is only as exact as the normalisation, and a kernel that normalises P before P V
# (SDPA's math backend: p = 1/l, rounded) is a few ulps off an exact mean, correctly.
def exact_mean(case, q, k, v, g):
    if case.dtype == "float32":
        return torch.zeros_like(q), k, v
    shape = (case.batch, case.kv_heads, 1, 1)
    mantissa = (129 + 2 * g.integers(0, 64, shape)).to(torch.float32)   # odd: 8 bits
    c = mantissa * (1 + g.integers(0, 2, shape)).to(torch.float32) * 2.0 ** -11   # exact
    c = torch.where(g.coin(shape), -c, c)
    return torch.zeros_like(q), k, c.expand(v.shape).clone()


# sentinel_sweep: every score past minus one magnitude T of SENTINEL_MAGNITUDES (one per case,
# among those its dtype, head dim and scale can reach), by at most a factor 2, so that a kernel
# filling hidden scores with a finite sentinel of magnitude T or less (-1e4, -1e9, half the
# dtype's lowest value ...) gives the hidden keys the larger score. Every key is -2^y in every
# head dim and q is +-2^x on some dims and 0 on the rest, so that q.k, the same for every key, is
# minus a power of two (the least one past T / |scale|): exact in fp32 in any order, in every
# dtype, and so is its product with any scale, scale * log2(e) included: a fused kernel that
# contracts s * c - m into one FMA subtracts the row's max exactly (p = 1), where a score of many
# significant bits would leave the product's rounding error, past 2^32 in base 2 enough for exp2
# to give 0 and empty the row. Every row's weights are uniform over the keys it sees.
# Below SIGNED_BELOW the dims come in threes, two +2^x and one -2^x: the terms cancel in part, so
# the sum of their magnitudes (the rule's S) is 3 times the score, and a kernel that rounds
# q * scale first rounds terms that do not all add in one direction (measured with equal terms of
# one sign: SDPA's CPU backward recomputed scores of 1e7 ~12 units of fp32 roundoff off, past the
# gradient rule's allowance). Above it no gradient can be judged (the rule allows more than
# fp32's range), and dims of one sign keep the partial sums within it.
FP16_MAX = float(torch.finfo(torch.float16).max)
BF16_MAX = float(torch.finfo(torch.bfloat16).max)
FP32_MAX = float(torch.finfo(torch.float32).max)
SENTINEL_MAGNITUDES = tuple(sorted({10.0 ** e for e in range(1, 39)}
                                   | {m * f for m in (FP16_MAX, BF16_MAX, FP32_MAX)
                                      for f in (0.5, 1.0)}))
SIGNED_BELOW = 1e20
LOG2E = 1.4426950408889634
# Room left below fp32's largest value for what a correct kernel forms from these scores: q.k
# (= score / scale) and the score times log2(e) of exp2 kernels.
HEADROOM = 1.1
FP16_EXPONENT = 15              # 2^15 = 32768: the largest power of two fp16 holds
_SWEEP_SALT = 0x5E27


def _query_dims(head_dim: int, signed: bool) -> tuple[int, int]:
    """(P, N): P head dims of q at +2^x then N at -2^x (the rest 0), P - N a power of two."""
    if signed and head_dim >= 3:
        negative = 1 << ((head_dim // 3).bit_length() - 1)
        return 2 * negative, negative
    return 1 << (head_dim.bit_length() - 1), 0


def _sweep_dot(magnitude: float, dtype: str, head_dim: int, scale: float) -> int | None:
    """log2 of |q.k| for magnitude T: the least power of two with |scale| 2^e > T, or None when a
    correct kernel could not form the scores finitely (fp32: q.k and score * log2(e); fp16: q
    and k within fp16's powers of two)."""
    s = abs(scale)
    if s == 0:
        return None
    exponent = math.floor(math.log2(magnitude / s)) + 1
    while 2.0 ** exponent * s <= magnitude:            # (log2 rounded at a power of two)
        exponent += 1
    dot = 2.0 ** exponent
    if HEADROOM * dot * max(1.0, s * LOG2E) > FP32_MAX:
        return None
    if dtype == "float16":
        positive, negative = _query_dims(head_dim, magnitude < SIGNED_BELOW)
        if exponent - (positive - negative).bit_length() + 1 > 2 * FP16_EXPONENT:
            return None
    return exponent


def reachable_magnitudes(dtype: str, head_dim: int, scale: float) -> list[float]:
    """The SENTINEL_MAGNITUDES a case of this dtype, head dim and scale can put scores past."""
    return [t for t in SENTINEL_MAGNITUDES if _sweep_dot(t, dtype, head_dim, scale) is not None]


def sentinel_magnitude(case) -> float | None:
    """The case's magnitude T: one of its reachable magnitudes, chosen by its data seed."""
    reachable = reachable_magnitudes(case.dtype, case.head_dim, case.softmax_scale)
    return reachable[_per_case(case, _SWEEP_SALT, len(reachable))] if reachable else None


def sentinel_sweep(case, q, k, v, g):
    magnitude = sentinel_magnitude(case)
    if magnitude is None:                  # scale 0: every score is 0 whatever q and k are
        return q, k, v
    exponent = _sweep_dot(magnitude, case.dtype, case.head_dim, case.softmax_scale)
    positive, negative = _query_dims(case.head_dim, magnitude < SIGNED_BELOW)
    per_dim = exponent - (positive - negative).bit_length() + 1     # x + y
    y = per_dim // 2 if case.dtype != "float16" else min(per_dim // 2, FP16_EXPONENT)
    a = math.copysign(2.0 ** (per_dim - y), case.softmax_scale)
    signs = [-1.0 if d % 3 == 2 and d < 3 * negative else 1.0 if d < positive + negative else 0.0
             for d in range(case.head_dim)]
    row = torch.tensor(signs, dtype=torch.float32, device=q.device) * a
    return row.expand(q.shape).clone(), torch.full_like(k, -(2.0 ** y)), v


PROFILE_VALUES = {"exact_mean": exact_mean, "sentinel_sweep": sentinel_sweep}


def source(generator: str, seed: int, device="cpu"):
    """The source a case's `generator` names, seeded with `seed`; a counter source computes on
    `device`, a CPU source always on the CPU."""
    if generator == "counter":
        return CounterSource(seed, device)
    if generator == "torch_cpu":
        return CpuSource(seed)
    raise ValueError(f"generator={generator!r} is not one of {GENERATORS}")
