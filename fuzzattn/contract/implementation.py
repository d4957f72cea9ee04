"""Implementation: a named attention callable and what it declares.

The callable follows the contract

    fn(q, k, v, *, causal, scale) -> out | (out, lse)

q is (B, Hq, Nq, D); k and v are (B, Hkv, Nk, D); out is (B, Hq, Nq, D) in q's dtype; lse is
(B, Hq, Nq) float32, the natural-log logsumexp of the scaled, masked scores. `causal` is False
or the alignment string "top_left" / "bottom_right" (truthy, so a kernel with one alignment may
treat it as a bool). Implementations declaring `out_buffer` also accept `out=` and `lse=` tensors
to write into. `Implementation.__call__` is the one place the contract's calling convention is
spoken: it translates a case into that call and checks the answer's shape and dtype.
"""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Callable

import torch

from fuzzattn.contract.capabilities import Capabilities
from fuzzattn.contract.case import AttentionCase


class ContractError(ValueError):
    """An implementation answered in a shape or dtype the contract does not allow."""


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
    # How a user names it on the command line when it is not registered (`path/file.py:NAME`):
    # every printed replay command carries it, so the command works as printed.
    spec: str | None = None
    # False for a plain callable (loaded without an Implementation around it): its `caps` are
    # the contract's base, assumed for it, not something it stated. What it never declared it
    # cannot be expected to refuse, so the refusal property does not apply to it.
    declares: bool = True

    @property
    def cli_name(self) -> str:
        """What `--impl` needs to find this implementation again."""
        return self.spec or self.name

    def __repr__(self) -> str:       # short: it appears in every falsifying example's printout
        return f"Implementation({self.name!r})"

    def supports(self, case: AttentionCase) -> bool:
        return self.caps.why_not(case) is None

    def __call__(self, q, k, v, case: AttentionCase, out=None, lse=None):
        """Call fn the contract's way and return (out, lse or None), checking shapes and dtypes."""
        kwargs = dict(causal=False if case.causal == "none" else case.causal,
                      scale=case.softmax_scale)
        if case.config:
            kwargs["config"] = case.config_dict
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
