"""How the Triton FlashAttention-2 forward is launched, dense (kernels/triton_fa2.py) or packed
(kernels/triton_fa2_varlen.py): the caller's output buffers checked, then one program per
(query tile, query head, batch element or sequence) with a pinned configuration or the
autotuner's pick."""
from __future__ import annotations

import torch
import triton

from fuzzattn.contract import refuse
from fuzzattn.kernels.triton_fa2_configs import autotuned


def output_buffer(name, given, shape, dtype, device):
    """The caller's buffer `given` (checked: shape, dtype, device, no self-overlap) or a new one."""
    if given is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if (not isinstance(given, torch.Tensor) or given.shape != shape or given.dtype != dtype
            or given.device != device or _overlaps_itself(given)):
        refuse(name, _describe(given), f"a non-overlapping {tuple(shape)} {dtype} tensor on {device}")
    return given


def launch(kernel, rows_heads_batch, args, meta, config):
    """One program per (query tile, query head, batch element or sequence): `config` pinned, or
    the autotuner's pick (compiled, config None). The grid depends on BLOCK_M, which the
    autotuner picks: a callable of the launch's meta."""
    rows, heads, batch = rows_heads_batch

    def grid(meta):
        return (triton.cdiv(rows, meta["BLOCK_M"]), heads, batch)

    if config is None:
        autotuned(kernel)[grid](*args, **meta)        # the production path: the autotuner picks
    else:
        # A pinned configuration is any point of the space, not only one the autotuner times:
        # the plain kernel launched with its meta-parameters and launch options.
        kernel[grid](*args, **meta, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
                     num_warps=config["num_warps"], num_stages=config["num_stages"])


def _overlaps_itself(t: torch.Tensor) -> bool:
    """A stride-0 dimension of size > 1 would make programs write the same element: refuse it."""
    return any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride()))


def _describe(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{tuple(t.shape)} {t.dtype} on {t.device}, strides {t.stride()}"
