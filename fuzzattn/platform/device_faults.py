"""What a CUDA device fault looks like: in an error's text, and in a context that a kernel left
unusable without raising."""
from __future__ import annotations

import re

# What a CUDA device fault looks like once it reaches Python: torch's RuntimeError/AcceleratorError
# texts and Triton's launcher errors, matched against the one-line crash summary judge() writes.
CUDA_FAULT = re.compile(
    r"CUDA error|CUDA_ERROR_|cudaError|AcceleratorError|illegal memory access|illegal instruction"
    r"|device-side assert|unspecified launch failure|misaligned address|Triton Error \[CUDA\]",
    re.IGNORECASE)


def is_device_fault(text: str) -> bool:
    return bool(CUDA_FAULT.search(text or ""))


def context_fault(device) -> str | None:
    """The CUDA error a synchronisation raises now, one line, or None (and None off CUDA).

    A CUDA error is sticky: once a kernel faulted, every later call in the process fails. A
    backward can fault without raising (or raise an error that does not say CUDA, as SDPA's fp16
    backward on misaligned rows did), and the next case judged in the same worker
    then failed with the first one's error. Checking after every judgement pins the fault on the
    case that caused it, and the supervisor replaces the worker."""
    import torch
    if torch.device(device).type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
        torch.zeros(1, device=device).add_(1).item()
    except Exception as exc:           # any error here means the context is unusable
        first = str(exc).splitlines()[0] if str(exc) else ""
        return f"{type(exc).__name__}: {first}"
    return None
