"""The one way fuzzattn runs an implementation, and the one summary of what it raised.

Judging, the refusal property, metamorphic relations and the load probe all call an
implementation through `call`, so an exception means the same thing everywhere:

    refused    UnsupportedCaseError, or an error the implementation declares as its way of
               refusing (`Capabilities.refusals`, e.g. a backend's "No available kernel")
    contract   it answered, but in a shape or dtype the contract does not allow
    crash      anything else it raised

`one_line` is the single exception summary every report uses: the type and the first line of
the message (a compiler's MLIR dump or a long traceback text never reaches the terminal).
"""
from __future__ import annotations

import dataclasses

import torch

from fuzzattn.contract.capabilities import UnsupportedCaseError
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.implementation import ContractError, Implementation

OK, REFUSED, CONTRACT, CRASH = "ok", "refused", "contract", "crash"


def one_line(exc: BaseException) -> str:
    """'TypeName: first line of the message' (the type alone when the message is empty)."""
    text = str(exc).strip().splitlines()
    first = text[0].strip() if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


@dataclasses.dataclass
class Call:
    """What one call of an implementation gave: its outputs, or how it failed."""
    status: str                              # ok | refused | contract | crash
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    error: BaseException | None = None
    summary: str = ""                        # one_line(error), or "" when it answered
    declared_refusal: bool = False           # refused with an error its Capabilities name
    grads: tuple | None = None               # (dq, dk, dv) of a call_gradients that answered

    @property
    def answered(self) -> bool:
        return self.status == OK


def is_declared_refusal(impl: Implementation, exc: BaseException) -> bool:
    """An error the implementation declares as its way of refusing (Capabilities.refusals)."""
    message = str(exc)
    return any(marker in message for marker in impl.caps.refusals)


def call(impl: Implementation, q, k, v, case: AttentionCase, *, out=None, lse=None,
         synchronize: bool = True) -> Call:
    """Call `impl` the contract's way on (q, k, v); never raises for what the kernel does.

    On CUDA the call is synchronised before returning, so an asynchronous kernel fault surfaces
    here, as this call's crash, not in whatever touches the device next."""
    try:
        got_out, got_lse = impl(q, k, v, case, out=out, lse=lse)
        if synchronize and q.device.type == "cuda":
            torch.cuda.synchronize(q.device)
    except ContractError as exc:
        return Call(CONTRACT, error=exc, summary=one_line(exc))
    except Exception as exc:       # a kernel that raises is a verdict, not a harness error
        declared = is_declared_refusal(impl, exc)
        status = REFUSED if declared or isinstance(exc, UnsupportedCaseError) else CRASH
        return Call(status, error=exc, summary=one_line(exc), declared_refusal=declared)
    return Call(OK, out=got_out, lse=got_lse)


def call_gradients(impl: Implementation, q, k, v, dout, case: AttentionCase, *, out=None,
                   lse=None, synchronize: bool = True) -> Call:
    """`Implementation.gradients` (explicit backward or autograd), summarised like `call`:
    whatever it raises is this call's crash, refusal or contract violation, never the harness's."""
    try:
        grads = impl.gradients(q, k, v, dout, case, out=out, lse=lse)
        if synchronize and q.device.type == "cuda":
            torch.cuda.synchronize(q.device)
    except ContractError as exc:
        return Call(CONTRACT, error=exc, summary=one_line(exc))
    except Exception as exc:       # a backward that raises is a verdict, not a harness error
        declared = is_declared_refusal(impl, exc)
        status = REFUSED if declared or isinstance(exc, UnsupportedCaseError) else CRASH
        return Call(status, error=exc, summary=one_line(exc), declared_refusal=declared)
    return Call(OK, grads=tuple(grads))
