"""Memory that shows what a kernel never wrote: NaN-filled allocations for the adversarial runs.

Shared by the forward's and the gradients' judging: an output (or gradient) a kernel leaves
partly unwritten then holds NaN, which the oracle never has, and a re-run with clean memory
names the cause.
"""
from __future__ import annotations

import contextlib
import sys
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

POISON_BLOCKS = 8   # freed NaN blocks per output size: the outputs and the kernel's own temporaries


def prime_allocator(sizes_in_bytes, device, byte: int) -> None:
    """Hand the allocator blocks of the outputs' sizes filled with `byte` (0xFF: NaN in every
    float dtype; 0x00: clean), so a kernel that returns memory it never wrote returns NaN.
    Several blocks per size, because the kernel may allocate temporaries of the same size before
    its outputs. Reliable with CUDA's caching allocator (freed blocks are reused for same-size
    requests); on the CPU it depends on malloc handing back a freed chunk (small sizes do;
    mmap-sized ones come back zeroed, and a missing write then shows as a value mismatch)."""
    filled_blocks(sizes_in_bytes, device, byte)     # freed at once, into the allocator's pools


def filled_blocks(sizes_in_bytes, device, byte: int) -> list[torch.Tensor]:
    """POISON_BLOCKS uint8 blocks of each non-zero size, every byte `byte`."""
    if torch.device(device).type == "cpu":
        # One fill each: on the CPU the multi-tensor ops below loop per tensor (~2x slower
        # than torch.full for the 16 blocks of a case), with no launches to save.
        return [torch.full((n,), byte, dtype=torch.uint8)
                for n in sizes_in_bytes if n for _ in range(POISON_BLOCKS)]
    blocks = [torch.empty((n,), dtype=torch.uint8, device=device)
              for n in sizes_in_bytes if n for _ in range(POISON_BLOCKS)]
    if blocks:
        # Two multi-tensor kernels for all the blocks instead of one fill each (16-24 per run):
        # on a GPU time-sliced between fuzzing processes every launch is a wait.
        # uint8 arithmetic: 0 + 255 is 0xFF.
        torch._foreach_zero_(blocks)
        if byte:
            torch._foreach_add_(blocks, byte)
    return blocks


class UninitializedMemoryIsZero(TorchDispatchMode):
    """Zero every tensor a kernel gets from torch.empty & co. for the duration.

    The attribution re-runs need output memory that is reliably *not* NaN. Handing the
    allocator zeroed blocks first (`prime_allocator(..., 0x00)`) is not enough on the CPU:
    whether malloc gives those blocks back depends on the process's whole heap history (which
    tests ran before in this xdist worker), so a kernel that never writes its output sometimes
    got a freed NaN block and was judged `out_of_bounds_read`. Intercepting the allocation ops themselves is
    independent of the heap: their results are zeroed whatever memory backs them."""

    EMPTY = frozenset({torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
                       torch.ops.aten.empty_strided.default, torch.ops.aten.new_empty.default,
                       torch.ops.aten.new_empty_strided.default})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func in self.EMPTY and isinstance(result, torch.Tensor):
            result.zero_()          # this mode is not active inside its own handler
        return result


def _set_deterministic_algorithms(mode: bool, *, warn_only: bool) -> None:
    """torch.use_deterministic_algorithms without its `import torch._inductor.config`.

    That import pulls in torch._dynamo (~900 modules, ~1.1 s of every process that imports
    fuzzattn: each xdist worker, each CLI or pytest subprocess). Imported lazily, inside a judge,
    those modules could also land inside an in-process pytest run (pytester), which unloads them
    afterwards; their re-import then fails ("Only a single TORCH_LIBRARY can be used to register
    the namespace _inductor_test") and every later judge in the process crashes. So it is not
    imported at all: the flag lives in torch._C, and Inductor's copy of it (the only other thing
    torch.use_deterministic_algorithms sets) is set as well whenever Inductor is loaded, which
    torch.compile does when a kernel is compiled, before any judge runs it."""
    inductor_config = sys.modules.get("torch._inductor.config")
    if inductor_config is not None:
        inductor_config.deterministic = mode
    torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


def adversarial_memory(poison: bool, compiled: bool):
    """The memory an adversarial run's kernel allocates from: NaN-filled (`poison`), else zeroed
    by UninitializedMemoryIsZero, except for a kernel that declares `compiles_per_shape`. Under
    a Python dispatch mode torch.compile'd code runs eagerly: flex_attention warned "called
    without torch.compile()", and its higher-order op then raised NotImplementedError (measured
    on the CPU), so the clean re-run judged another kernel, which failed. Such a kernel's clean
    re-runs get the allocator's zeroed blocks alone (prime_allocator) on CUDA, whose caching
    allocator hands them back reliably; on the CPU nothing zeroes its allocations, and an output
    it leaves unwritten may be named an out-of-bounds read instead."""
    if poison:
        return uninitialized_memory_is_nan()
    return contextlib.nullcontext() if compiled else UninitializedMemoryIsZero()


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
        _set_deterministic_algorithms(True, warn_only=True)
        deterministic.fill_uninitialized_memory = True
        try:
            yield
        finally:
            _set_deterministic_algorithms(previous[0], warn_only=previous[1])
            deterministic.fill_uninitialized_memory = previous[2]
