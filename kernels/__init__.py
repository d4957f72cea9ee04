"""Implementations under test: the article's Triton FA2 forward, its tiled PyTorch twin (and its
packed varlen loop), SDPA (and its explicit-mask references for the window, ALiBi and packed
batches) and FlexAttention.

`ensure_backend()` runs before anything else here: `@triton.jit` reads TRITON_INTERPRET when it
decorates, so the interpreter must be chosen (on machines without a GPU) before triton_fa2 loads.
"""
from fuzzattn.triton_interpreter.backend import ensure_backend

ensure_backend()

from . import (flex, flex_varlen, sdpa, sdpa_alibi, sdpa_varlen,  # noqa: E402  (after ensure_backend)
               sdpa_window, torch_tiled, torch_varlen, triton_fa2)

# sdpa.BACKEND_IMPLS: one SDPA backend each, those that can run on this torch and device
# (sdpa.UNAVAILABLE says why the others are absent).
# flex.REGISTERED and flex_varlen.REGISTERED are None on a torch without FlexAttention
# (flex.UNAVAILABLE says why) and where its compiled path is known wrong (flex.CPU_DEFECT).
IMPLEMENTATIONS = ((triton_fa2.IMPL, torch_tiled.IMPL, torch_varlen.IMPL, sdpa.IMPL)
                   + sdpa.BACKEND_IMPLS + (sdpa_window.IMPL, sdpa_alibi.IMPL, sdpa_varlen.IMPL)
                   + tuple(impl for impl in (flex.REGISTERED, flex_varlen.REGISTERED) if impl is not None))
