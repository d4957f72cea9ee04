"""The implementation contract: what a kernel under test is, and what it declares it supports.

An implementation wraps a callable

    fn(q, k, v, *, causal, scale) -> out | (out, lse)

q is (B, Hq, Nq, D); k and v are (B, Hkv, Nk, D); out is (B, Hq, Nq, D) in q's dtype; lse is
(B, Hq, Nq) float32, the natural-log logsumexp of the scaled, masked scores. `causal` is False
or the alignment string "top_left" / "bottom_right" (truthy, so a kernel with one alignment may
treat it as a bool). Implementations declaring `out_buffer` also accept `out=` and `lse=` tensors
to write into. The fuzzer draws only what `Capabilities` declares; anything else must be refused
with an exception (see `refuse`).
"""
from __future__ import annotations

import dataclasses
import inspect
import math
from pathlib import Path
from typing import Callable

import torch

from .case import CAUSAL_ALIGNMENTS, DTYPES, AttentionCase

# The contract's base: what a plain callable is assumed to support when it declares nothing.
BASE_DTYPES = frozenset({"float32", "bfloat16"})
BASE_HEAD_DIMS = frozenset({16, 32, 64, 128})
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
STRIDE_KINDS = ("contiguous", "unit_last", "any")
FP32_MATMULS = ("ieee", "tf32")


class UnsupportedCaseError(ValueError):
    """Raised by an implementation for an input outside its declared capabilities."""


class ContractError(ValueError):
    """An implementation answered in a shape or dtype the contract does not allow."""


def refuse(what: str, value, supported) -> None:
    """Raise the one-line refusal every kernel in this repo uses for undeclared inputs."""
    raise UnsupportedCaseError(f"{what}={value!r} is not supported (supported: {supported})")


@dataclasses.dataclass(frozen=True)
class Capabilities:
    dtypes: frozenset[str] = BASE_DTYPES
    head_dims: frozenset[int] | None = BASE_HEAD_DIMS   # None: any head dim up to max_head_dim
    max_head_dim: int = 256
    causal: tuple[str, ...] = ("top_left",)             # alignments accepted besides non-causal
    gqa: bool = False                                    # Hkv < Hq (Hq a multiple of Hkv)
    strides: str = "any"                                 # contiguous | unit_last | any
    zero_length: bool = False                            # Nq == 0 or Nk == 0
    returns_lse: bool = True
    backward: bool = False
    fp32_matmul: str = "ieee"                            # ieee | tf32
    deterministic: bool = True                           # bitwise-identical reruns
    out_buffer: bool = False                             # accepts out= / lse= to write into

    def __post_init__(self):
        object.__setattr__(self, "dtypes", frozenset(self.dtypes))
        if self.head_dims is not None:
            object.__setattr__(self, "head_dims", frozenset(self.head_dims))
        object.__setattr__(self, "causal", tuple(self.causal))
        bad = sorted(set(self.dtypes) - set(DTYPES))
        if bad:
            raise ValueError(f"dtypes={bad[0]!r} is not one of {DTYPES}")
        bad = [a for a in self.causal if a not in CAUSAL_ALIGNMENTS]
        if bad:
            raise ValueError(f"causal={bad[0]!r} is not one of {CAUSAL_ALIGNMENTS}")
        if self.strides not in STRIDE_KINDS:
            raise ValueError(f"strides={self.strides!r} is not one of {STRIDE_KINDS}")
        if self.fp32_matmul not in FP32_MATMULS:
            raise ValueError(f"fp32_matmul={self.fp32_matmul!r} is not one of {FP32_MATMULS}")

    def accepts_head_dim(self, d: int) -> bool:
        return d in self.head_dims if self.head_dims is not None else 1 <= d <= self.max_head_dim

    def accepts_layout(self, layout: str) -> bool:
        if self.strides == "any":
            return True
        if self.strides == "unit_last":
            return layout != "last_dim_strided"
        return layout == "contiguous"

    def why_not(self, case: AttentionCase) -> str | None:
        """The first reason this case is outside the declared capabilities, or None."""
        if case.dtype not in self.dtypes:
            return f"dtype={case.dtype}"
        if not self.accepts_head_dim(case.head_dim):
            return f"head_dim={case.head_dim}"
        if case.causal != "none" and case.causal not in self.causal:
            return f"causal={case.causal}"
        if case.kv_heads != case.heads and not self.gqa:
            return f"kv_heads={case.kv_heads} < heads={case.heads}"
        if not self.zero_length and (case.seq_q == 0 or case.seq_k == 0):
            return f"zero length (seq_q={case.seq_q}, seq_k={case.seq_k})"
        for tensor, layout in zip("qkv", case.layout):
            if not self.accepts_layout(layout):
                return f"layout[{tensor}]={layout}"
        return None

    def check_inputs(self, q, k, v, *, causal, scale) -> tuple[str, float]:
        """Refuse, in one line (UnsupportedCaseError), any tensors outside this declaration;
        return the call's (causal, scale) in the project's one encoding: causal is "none",
        "top_left" or "bottom_right" (a bare True means top-left, SDPA's and the article's
        alignment), scale a float. Kernels read their sizes from the tensors themselves."""
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                refuse(f"type({name})", type(t).__name__, "torch.Tensor")
            if t.dim() != 4:
                refuse(f"{name}.dim()", t.dim(), "4: (B, H, N, D)")
            if DTYPE_NAMES.get(t.dtype) not in self.dtypes:
                refuse(f"{name}.dtype", str(t.dtype), sorted(self.dtypes))
        if not (k.dtype == v.dtype == q.dtype):
            refuse("dtypes (q, k, v)", (str(q.dtype), str(k.dtype), str(v.dtype)), "one shared dtype")
        if not (q.device == k.device == v.device):
            refuse("devices (q, k, v)", (str(q.device), str(k.device), str(v.device)), "one device")
        batch, heads, seq_q, head_dim = q.shape
        _, kv_heads, seq_k, _ = k.shape
        if k.shape != v.shape:
            refuse("v.shape", tuple(v.shape), f"k.shape {tuple(k.shape)}")
        if k.shape[0] != batch or k.shape[3] != head_dim:
            refuse("k.shape", tuple(k.shape), f"(B={batch}, Hkv, Nk, D={head_dim})")
        if batch == 0 or heads == 0:
            refuse("batch, heads", (batch, heads), "at least 1 each")
        if kv_heads == 0 or heads % kv_heads:
            refuse("kv_heads", kv_heads, f"a divisor of heads={heads}")
        if kv_heads != heads and not self.gqa:
            refuse("kv_heads", kv_heads, f"heads={heads} (no GQA)")
        if not self.accepts_head_dim(head_dim):
            refuse("head_dim", head_dim, sorted(self.head_dims) if self.head_dims is not None
                   else f"1..{self.max_head_dim}")
        if not self.zero_length and (seq_q == 0 or seq_k == 0):
            refuse("zero length (seq_q, seq_k)", (seq_q, seq_k), "seq_q >= 1 and seq_k >= 1")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not self.accepts_strides(t):
                refuse(f"{name}.stride()", t.stride(), f"{self.strides} strides")
        if causal is True:
            causal = "top_left"
        elif causal is False or causal is None:
            causal = "none"
        elif not isinstance(causal, str) or causal not in self.causal:
            refuse("causal", causal, "False, True" + "".join(f", {a!r}" for a in self.causal))
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            refuse("scale", scale, "a finite float")
        return causal, float(scale)

    def accepts_strides(self, t: torch.Tensor) -> bool:
        """Whether a tensor's memory layout is inside `strides` (stride-0 broadcasts count as any)."""
        if self.strides == "any":
            return True
        if self.strides == "unit_last":
            return t.shape[-1] <= 1 or t.stride(-1) == 1
        return t.is_contiguous()


@dataclasses.dataclass(frozen=True, repr=False)
class Implementation:
    """A named attention implementation and what it declares."""
    name: str
    fn: Callable
    caps: Capabilities = Capabilities()
    description: str = ""
    # Set for seeded-bug variants: the bug it plants, so reports read by themselves.
    mutant_of: str | None = None
    # "triton" for kernels that run under Triton's interpreter on CPU (bf16 skip logic applies).
    backend: str = "torch"
    # Source files whose change means this implementation must be fuzzed again (gate --changed-since).
    sources: tuple[str, ...] = ()

    def __repr__(self) -> str:       # short: it appears in every falsifying example's printout
        return f"Implementation({self.name!r})"

    def supports(self, case: AttentionCase) -> bool:
        return self.caps.why_not(case) is None

    def __call__(self, q, k, v, case: AttentionCase, out=None, lse=None):
        """Call fn the contract's way and return (out, lse or None), checking shapes and dtypes."""
        kwargs = dict(causal=False if case.causal == "none" else case.causal,
                      scale=case.softmax_scale)
        if out is not None:
            kwargs["out"] = out
            if lse is not None:
                kwargs["lse"] = lse
        result = self.fn(q, k, v, **kwargs)
        got_out, got_lse = (result if isinstance(result, tuple) else (result, None))
        if isinstance(result, tuple) and len(result) != 2:
            raise ContractError(f"{self.name} returned a tuple of {len(result)}; expected (out, lse)")
        expected = tuple(q.shape)
        if not isinstance(got_out, torch.Tensor) or tuple(got_out.shape) != expected:
            shape = tuple(got_out.shape) if isinstance(got_out, torch.Tensor) else type(got_out).__name__
            raise ContractError(f"{self.name} returned out of shape {shape}; expected {expected}")
        if got_out.dtype != q.dtype:
            raise ContractError(f"{self.name} returned out of dtype {got_out.dtype}; expected {q.dtype}")
        if got_lse is not None:
            if not isinstance(got_lse, torch.Tensor) or tuple(got_lse.shape) != expected[:3]:
                shape = tuple(got_lse.shape) if isinstance(got_lse, torch.Tensor) else type(got_lse).__name__
                raise ContractError(f"{self.name} returned lse of shape {shape}; expected {expected[:3]}")
            if got_lse.dtype != torch.float32:
                raise ContractError(f"{self.name} returned lse of dtype {got_lse.dtype}; expected torch.float32")
        return got_out, got_lse

    def source_files(self) -> tuple[str, ...]:
        """Files that define this implementation (declared, else the callable's own module)."""
        if self.sources:
            return self.sources
        try:
            return (str(Path(inspect.getsourcefile(inspect.unwrap(self.fn))).resolve()),)
        except (TypeError, OSError):
            return ()
