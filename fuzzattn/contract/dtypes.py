"""The one dtype table: every floating-point type fuzzattn knows, by name, with what the rest of
the package needs to know about it (the torch dtype, its short name in case strings, its unit
roundoff and precision). torch is imported only when a torch dtype is asked for: the command
line's options name dtypes before anything needs torch."""
from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclasses.dataclass(frozen=True)
class DType:
    name: str                 # as written in cases and regression files, and torch's own name
    short: str                # as printed in a case's one-line description
    precision_bits: int       # significand bits, the implicit one included

    @property
    def torch(self) -> torch.dtype:
        import torch
        return getattr(torch, self.name)

    @property
    def unit_roundoff(self) -> float:
        """u = 2^-p: the largest relative error of rounding to nearest in this type."""
        return 2.0 ** -self.precision_bits

    @property
    def itemsize(self) -> int:
        return self.torch.itemsize


# Input dtypes a case may have, in the order strategies draw (and shrink toward) them.
_INPUT = (DType("float32", "fp32", 24), DType("bfloat16", "bf16", 8), DType("float16", "fp16", 11))
FLOAT64 = DType("float64", "fp64", 53)

DTYPES = tuple(d.name for d in _INPUT)
BY_NAME = {d.name: d for d in _INPUT + (FLOAT64,)}

U32 = BY_NAME["float32"].unit_roundoff       # fp32: running state, sums and lse are fp32
TF32_ROUNDOFF = 2.0 ** -11                    # a TF32 matmul operand keeps 10 explicit mantissa bits
# ... and a worst-case bound must take them truncated: the tensor cores read the first 10 bits of
# an fp32 operand (Triton's fp32 tl.dot rounds to nearest only when asked), so one operand is off
# by up to 2^-10 of itself. Seen: triton_fa2's score_shift compiled with TF32, D=1, lse off by
# 2.3 x 2^-11 of |q| |k + w|, past a round-to-nearest bound.
TF32_TRUNCATION = 2.0 ** -10


def torch_dtype(name: str) -> torch.dtype:
    return BY_NAME[name].torch


@functools.cache
def of_torch(dtype: torch.dtype) -> DType | None:
    """The table's entry for a torch dtype (torch.half is float16's), None for one it lacks."""
    entry = BY_NAME.get(str(dtype).rpartition(".")[2])     # str(torch.float16): "torch.float16"
    return entry if entry is not None and entry.torch == dtype else None


def _entry(dtype: str | torch.dtype) -> DType:
    entry = BY_NAME.get(dtype) if isinstance(dtype, str) else of_torch(dtype)
    if entry is None:
        raise KeyError(dtype)
    return entry


def reads_tf32(dtype: str | torch.dtype, fp32_matmul: str) -> bool:
    """Whether an implementation declaring `fp32_matmul` feeds tensor cores TF32 operands for
    inputs of `dtype`: only fp32 inputs of a "tf32" declaration (bf16/fp16 dots are exact)."""
    entry = _entry(dtype)
    return fp32_matmul == "tf32" and entry.name == "float32"


def unit_roundoff(dtype: str | torch.dtype) -> float:
    return _entry(dtype).unit_roundoff
