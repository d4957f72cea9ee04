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
# sdpa_alibi is registered everywhere: the CUDA upstream defects its GPU campaigns met are
# declared (kernels/sdpa_defects.py). sdpa_varlen only off CUDA: its fp16 backward there met a new
# non-finite gradient class in each of its last three GPU campaigns (each declared, the next not
# yet ruled out), and a GPU host's gate would report stock code's next one as a finding. Neither
# is flex_varlen, compile-bound on CUDA (0.2-0.4 cases/s, flex's decoding defects declared).
# `--impl fuzzattn.kernels.sdpa_varlen:IMPL` (flex_varlen) fuzzes one anyway.
UNJUDGED_ON_CUDA = (sdpa_varlen.IMPL,)
IMPLEMENTATIONS = ((triton_fa2.IMPL, triton_fa2_varlen.IMPL, torch_tiled.IMPL, torch_varlen.IMPL, sdpa.IMPL)
                   + sdpa.BACKEND_IMPLS + (sdpa_window.IMPL, sdpa_alibi.IMPL)
                   + (() if torch.cuda.is_available() else UNJUDGED_ON_CUDA)
                   + (() if flex.REGISTERED is None else (flex.REGISTERED,)))
