"""Tensors between the host and an accelerator in one copy.

On a GPU shared by several fuzzing processes (no MPS), each process gets the GPU in time slices,
and every copy or synchronisation waits for this process's next slice. A judged case moves its three input storages to the device and reads
back its outputs and its check flags: packed into one buffer, each direction is one copy.

Pinned memory with non-blocking copies would avoid the waits altogether, but a pinned block freed
after a kernel left the CUDA context faulted aborts the process (c10::AcceleratorError thrown
from a tensor's destructor: a fuzzer died so on a known SDPA backward fault), and a fuzzer must outlive the faults it finds. Plain copies into pageable memory it is.
"""
from __future__ import annotations

import torch

ALIGN = 512      # bytes: what the CUDA caching allocator aligns every allocation to
FILL = 0xFF      # between packed tensors: NaN in every float dtype


def same_device(a: torch.device, b: torch.device) -> bool:
    """`cuda` and `cuda:0` are the same device when the current device is 0."""
    if a == b:          # two torch.device objects alike (asked several times a judged case)
        return True
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.type == "cuda" and (a.index is None or b.index is None):
        current = torch.cuda.current_device()
        return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)
    return a.index == b.index


def storage_offsets(sizes) -> tuple[list[int], int]:
    """Byte offset of each of `sizes` (bytes) in a packed buffer, each on an ALIGN boundary,
    and the buffer's size."""
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // ALIGN) * ALIGN
    return offsets, end


def _layout(tensors) -> tuple[list[int], int]:
    """Byte offset of each tensor in the packed buffer, and the buffer's size."""
    return storage_offsets([t.numel() * t.element_size() for t in tensors])


def unpacked(buffer: torch.Tensor, like, offsets) -> list[torch.Tensor]:
    """Views of `buffer` with the dtypes and shapes of `like`, from `offsets` (see `packed`)."""
    return [buffer[o:o + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            for t, o in zip(like, offsets)]


def packed(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """One uint8 buffer on the tensors' device holding each tensor's bytes from an ALIGN
    boundary, the gaps filled with FILL; and each tensor's byte offset in it."""
    offsets, size = _layout(tensors)
    buffer = torch.full((size,), FILL, dtype=torch.uint8, device=tensors[0].device)
    for t, o in zip(tensors, offsets):
        buffer[o:o + t.numel() * t.element_size()].copy_(t.contiguous().reshape(-1).view(torch.uint8))
    return buffer, offsets


def packed_to(tensors: list[torch.Tensor], device) -> list[torch.Tensor]:
    """Contiguous copies of `tensors` (all on one device) on `device`, moved in one copy; the
    copies share one allocation (see `packed`)."""
    device = torch.device(device)
    if len(tensors) < 2 or same_device(tensors[0].device, device):
        return [t.contiguous().to(device) for t in tensors]
    return packed_buffer_to(tensors, device)[1]


def packed_buffer_to(tensors: list[torch.Tensor], device) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`packed_to`'s copies, always packed, with the uint8 buffer they are views of: what a
    caller copies or compares whole, one kernel instead of one per tensor."""
    buffer, offsets = packed(tensors)
    buffer = buffer.to(torch.device(device))
    return buffer, unpacked(buffer, tensors, offsets)


def read_back(tensors, device) -> list:
    """`tensors` (None stays None) on `device`: those elsewhere are read back together, in one
    copy (contiguous, the same values and shapes)."""
    device = torch.device(device)
    if device.type == "cpu" and all(t is None or t.device.type == "cpu" for t in tensors):
        return list(tensors)            # judged on the host where they are (a CPU run)
    away = [i for i, t in enumerate(tensors) if t is not None and not same_device(t.device, device)]
    result = list(tensors)
    if len({tensors[i].device for i in away}) > 1:        # several sources: one copy each
        return [t if t is None else t.to(device) for t in tensors]
    for i, moved in zip(away, packed_to([tensors[i] for i in away], device)):
        result[i] = moved
    return result
