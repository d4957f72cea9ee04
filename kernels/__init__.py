"""Implementations under test: the article's Triton FA2 forward, its tiled PyTorch twin (and its
packed varlen loop), SDPA (and its explicit-mask references for the window, ALiBi and packed
batches) and FlexAttention.

`ensure_backend()` runs before anything else here: `@triton.jit` reads TRITON_INTERPRET when it
decorates, so the interpreter must be chosen (on machines without a GPU) before triton_fa2 loads.
"""
from fuzzattn.triton_interpreter.backend import ensure_backend

ensure_backend()

import torch  # noqa: E402

from . import (flex, sdpa, sdpa_alibi, sdpa_varlen, sdpa_window,  # noqa: E402  (after ensure_backend)
               torch_tiled, torch_varlen, triton_fa2, triton_fa2_varlen)

# sdpa.BACKEND_IMPLS: one SDPA backend each, those that can run on this torch and device
# (sdpa.UNAVAILABLE says why the others are absent).
# flex.REGISTERED is None on a torch without FlexAttention (flex.UNAVAILABLE says why) and where
# its compiled path is known wrong (flex.CPU_DEFECT).
# References no GPU campaign has judged yet are registered only where one has (the CPU): on CUDA
# they call the same masked SDPA as sdpa_window, whose two CUDA upstream defects
# (kernels/sdpa_defects.py) are not declared for them, and a GPU host's gate fuzzing them would
# report stock code's known bugs as new findings. flex_varlen's compiled path has not run at all.
# `--impl fuzzattn.kernels.sdpa_alibi:IMPL` (sdpa_varlen, flex_varlen) fuzzes one there anyway.
UNJUDGED_ON_CUDA = (sdpa_alibi.IMPL, sdpa_varlen.IMPL)
IMPLEMENTATIONS = ((triton_fa2.IMPL, triton_fa2_varlen.IMPL, torch_tiled.IMPL, torch_varlen.IMPL, sdpa.IMPL)
                   + sdpa.BACKEND_IMPLS + (sdpa_window.IMPL,)
                   + (() if torch.cuda.is_available() else UNJUDGED_ON_CUDA)
                   + (() if flex.REGISTERED is None else (flex.REGISTERED,)))
