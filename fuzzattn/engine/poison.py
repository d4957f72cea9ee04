"""Memory that shows what a kernel never wrote: NaN-filled allocations for the adversarial runs.

Shared by the forward's and the gradients' judging: an output (or gradient) a kernel leaves
partly unwritten then holds NaN, which the oracle never has, and a re-run with clean memory
names the cause.
"""
from __future__ import annotations

import contextlib
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# torch.use_deterministic_algorithms imports torch._dynamo (~900 modules) on its first call. Done
# lazily, inside a judge, those imports can land inside an in-process pytest run (pytester), which
# unloads them afterwards; their re-import then fails ("Only a single TORCH_LIBRARY can be used to
# register the namespace _inductor_test") and every later judge in the process crashes. Setting
# the current value again here pays the same imports once, when this module is imported.
torch.use_deterministic_algorithms(torch.are_deterministic_algorithms_enabled(),
                                   warn_only=torch.is_deterministic_algorithms_warn_only_enabled())

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


class UninitializedMemoryIsZero(TorchDispatchMode):
    """Zero every tensor a kernel gets from torch.empty & co. for the duration.

    The attribution re-runs need output memory that is reliably *not* NaN. Handing the
    allocator zeroed blocks first (`prime_allocator(..., 0x00)`) is not enough on the CPU:
    whether malloc gives those blocks back depends on the process's whole heap history (which
    tests ran before in this xdist worker), so a kernel that never writes its output sometimes
    got a freed NaN block and was judged `out_of_bounds_read` (measured: 8 of 40 judgements
    after freeing NaN blocks of assorted sizes). Intercepting the allocation ops themselves is
    independent of the heap: their results are zeroed whatever memory backs them."""

    EMPTY = frozenset({torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
                       torch.ops.aten.empty_strided.default, torch.ops.aten.new_empty.default,
                       torch.ops.aten.new_empty_strided.default})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func in self.EMPTY and isinstance(result, torch.Tensor):
            result.zero_()          # this mode is not active inside its own handler
        return result


# torch.use_deterministic_algorithms imports torch._dynamo (~900 modules) on its first call. Done
# lazily, inside a judge, those imports can land inside an in-process pytest run (pytester), which
# unloads them afterwards; their re-import then fails ("Only a single TORCH_LIBRARY can be used to
# register the namespace _inductor_test") and every later judge in the process crashes. Setting
# the current value again here pays the same imports once, when the judge itself is imported.
torch.use_deterministic_algorithms(torch.are_deterministic_algorithms_enabled(),
                                   warn_only=torch.is_deterministic_algorithms_warn_only_enabled())


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
