"""Implementation: a named attention callable and what it declares.

The callable follows the contract

    fn(q, k, v, *, causal, scale) -> out | (out, lse)

q is (B, Hq, Nq, D); k and v are (B, Hkv, Nk, D); out is (B, Hq, Nq, D) in q's dtype; lse is (B, Hq,
Nq) float32, the natural-log logsumexp of the scaled, masked scores. `causal` is False or the
alignment string "top_left" / "bottom_right" (truthy, so a kernel with one alignment may treat it as
a bool). Implementations declaring `out_buffer` also accept `out=` and `lse=` tensors to write into;
those declaring `window` / `softcap` / `alibi` get `window=(left, right)` / `softcap=float` /
`alibi_slopes=` (Hq,) float32 or None (AttentionCase's definitions), the explicit backward too;
those declaring `paged_kv` get k, v as paged caches with `block_table=` and `cache_seqlens=` (None
for a dense case) in the forward (contract/paged.py); those declaring `varlen` get the packed call of
contract/varlen.py instead. `Implementation.__call__` is the one place the
contract's calling convention is spoken: it translates a case into that call and checks the answer's
shape and dtype.

Gradients (`Capabilities.backward=True`: "judge my gradients") come one of two ways:

* autograd of `fn`: no `backward_fn`; fn must be differentiable in q, k and v;
* an explicit `backward_fn(q, k, v, out, lse, dout, *, causal, scale[, config]) -> (dq, dk, dv)`,
  handed the forward's own out and lse. dq has q's shape; dk and dv have k's shape, summed over
  each GQA group; all in the input dtype. `config` is passed only when the case carries backward
  configuration keys ("bwd_" names, prefix removed).

`Implementation.gradients` is the one place that convention is spoken.
"""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Callable

import torch

from fuzzattn.contract.alibi import alibi_slopes
from fuzzattn.contract.capabilities import Capabilities
from fuzzattn.contract import varlen
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.paged import page


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
    # The explicit backward (module docstring); None: gradients by autograd of fn.
    backward_fn: Callable | None = None
    # The loader's probe case when the probe call failed on it (fuzzattn/run/loader.py): a
    # campaign judges it first, so that failure is a saved, replayable counterexample.
    probe_case: AttentionCase | None = None

    @property
    def cli_name(self) -> str:
        """What `--impl` needs to find this implementation again."""
        return self.spec or self.name

    def __repr__(self) -> str:       # short: it appears in every falsifying example's printout
        return f"Implementation({self.name!r})"

    def supports(self, case: AttentionCase) -> bool:
        return self.caps.why_not(case) is None

    def _kwargs(self, case: AttentionCase, device) -> dict:
        """The case's keyword arguments: causal and scale, and each variant the implementation
        declares (and only those, so a kernel without them keeps its plain signature)."""
        kwargs = dict(causal=False if case.causal == "none" else case.causal,
                      scale=case.softmax_scale)
        if self.caps.window:
            kwargs["window"] = case.window
        if self.caps.softcap:
            kwargs["softcap"] = case.softcap
        if self.caps.alibi:
            kwargs["alibi_slopes"] = (alibi_slopes(case.alibi, case.heads, device)
                                      if case.alibi else None)
        return kwargs

    def __call__(self, q, k, v, case: AttentionCase, out=None, lse=None):
        """Call fn the contract's way and return (out, lse or None), checking shapes and dtypes."""
        kwargs = self._kwargs(case, q.device)
        if self.caps.paged_kv:          # the forward alone: an explicit backward gets k, v dense
            paged = page(k, v, case) if case.paged_kv else None
            kwargs["block_table"] = kwargs["cache_seqlens"] = None
            if paged is not None:
                k, v = paged.k_cache, paged.v_cache
                kwargs.update(block_table=paged.block_table, cache_seqlens=paged.cache_seqlens)
        forward_config = self.caps.pass_config(case, backward=False)
        if forward_config:
            kwargs["config"] = forward_config
        if self.caps.varlen:
            return varlen.packed_call(self.name, self.fn, q, k, v, case, kwargs, out, lse,
                                      ContractError)
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

    def gradients(self, q, k, v, dout, case: AttentionCase, *, out=None, lse=None):
        """(dq, dk, dv) of out = attention(q, k, v) against the upstream gradient dout, the
        contract's way: the explicit backward_fn on (out, lse) (computed here by the forward when
        not given), else autograd of fn. Checks the answer's shapes and dtypes."""
        if self.backward_fn is not None:
            if out is None:
                out, lse = self(q, k, v, case)
            kwargs = self._kwargs(case, q.device)
            backward_config = self.caps.pass_config(case, backward=True)
            if backward_config:
                kwargs["config"] = backward_config
            if self.caps.varlen:
                grads = varlen.packed_backward(self.name, self.backward_fn, q, k, v, out, lse,
                                               dout, case, kwargs)
            else:
                grads = self.backward_fn(q, k, v, out, lse, dout, **kwargs)
        else:
            grads = self._autograd(q, k, v, dout, case)
        if not isinstance(grads, tuple) or len(grads) != 3:
            raise ContractError(f"{self.name}'s backward returned {type(grads).__name__}; "
                                "expected (dq, dk, dv)")
        for name, g, like in zip(("dq", "dk", "dv"), grads, (q, k, v)):
            if not isinstance(g, torch.Tensor) or tuple(g.shape) != tuple(like.shape):
                shape = tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
                raise ContractError(f"{self.name} returned {name} of shape {shape}; "
                                    f"expected {tuple(like.shape)}")
            if g.dtype != like.dtype:
                raise ContractError(f"{self.name} returned {name} of dtype {g.dtype}; "
                                    f"expected {like.dtype}")
        return grads

    def _autograd(self, q, k, v, dout, case: AttentionCase):
        """Gradients by autograd of the forward. The leaves are detached aliases of the inputs
        (same storage, same strides), so the forward reads exactly the tensors it was given. An
        input the output does not depend on (e.g. every row empty) gets a zero gradient."""
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        with torch.enable_grad():
            out, _ = self(*leaves, case)
            if not out.requires_grad:
                grads = (None, None, None)
            else:
                grads = torch.autograd.grad(out, leaves, dout, allow_unused=True)
        return tuple(torch.zeros_like(leaf) if g is None else g.detach()
                     for g, leaf in zip(grads, leaves))

    def source_files(self) -> tuple[str, ...]:
        """Files that define this implementation (declared, else the callable's own module)."""
        if self.sources:
            return self.sources
        try:
            return (str(Path(inspect.getsourcefile(inspect.unwrap(self.fn))).resolve()),)
        except (TypeError, OSError):
            return ()
