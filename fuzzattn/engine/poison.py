"""Memory that shows what a kernel never wrote: NaN-filled allocations for the adversarial runs.

Shared by the forward's and the gradients' judging: an output (or gradient) a kernel leaves
partly unwritten then holds NaN, which the oracle never has, and a re-run with clean memory
names the cause.
"""
from __future__ import annotations

import contextlib
import warnings

import torch

POISON_BLOCKS = 8   # freed NaN blocks per output size: the outputs and the kernel's own temporaries


def prime_allocator(sizes_in_bytes, device, byte: int) -> None:
    """Hand the allocator blocks of the outputs' sizes filled with `byte` (0xFF: NaN in every
    float dtype; 0x00: clean), so a kernel that returns memory it never wrote returns NaN.
    Several blocks per size, because the kernel may allocate temporaries of the same size before
    its outputs. Reliable with CUDA's caching allocator (freed blocks are reused for same-size
    requests); on the CPU it depends on malloc handing back a freed chunk (small sizes do;
    mmap-sized ones come back zeroed, and a missing write then shows as a value mismatch)."""
    blocks = [torch.full((n,), byte, dtype=torch.uint8, device=device)
              for n in sizes_in_bytes if n for _ in range(POISON_BLOCKS)]
    del blocks


@contextlib.contextmanager
def uninitialized_memory_is_nan():
    """Make torch.empty & co. return NaN-filled memory (CPU and CUDA) for the duration: torch
    fills uninitialised memory when deterministic algorithms are on. warn_only, so kernels
    without a deterministic variant still run; their warnings are not ours to show."""
    import torch.utils.deterministic as deterministic
    previous = (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
                deterministic.fill_uninitialized_memory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.use_deterministic_algorithms(True, warn_only=True)
        deterministic.fill_uninitialized_memory = True
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
            deterministic.fill_uninitialized_memory = previous[2]
