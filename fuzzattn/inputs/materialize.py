"""Materialise an AttentionCase into q, k, v: deterministic values inside guarded storage.

Values come from the source the case's `generator` names (fuzzattn/inputs/sources.py). From the CPU
`torch.Generator(case.data_seed)` (torch_cpu) they are rounded to the case's dtype on the CPU; the
storages (guards included) are then moved to the device in one piece and the views rebuilt there
with `as_strided`, so every machine sees the same bits at the same offsets. From the counter
generator they are computed where the case runs, directly into the same packed storages: the
same bits on every device, with no host copy and no transfer.

Every tensor lives inside a larger storage whose unused elements hold `pad_value` (NaN by
default, after xformers): a kernel that reads past a sequence end, past D, or outside the tensor
picks up NaN, which the oracle never has.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import math

import torch

from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.dtypes import BY_NAME, torch_dtype
from fuzzattn.inputs.transfer import FILL, packed_buffer_to, same_device, storage_offsets
from fuzzattn.inputs.sources import PROFILE_VALUES, source


# NaN padding before and after each tensor inside its storage: a tile load without its row mask
# reads up to (tile - 1) rows past the end, so the guard spans 16 rows of the widest row stride
# a layout gives (sliced: 2 (D + 3)), and never fewer than 64 elements.
GUARD_ROWS = 16


def guard_elements(head_dim: int) -> int:
    return max(64, GUARD_ROWS * 2 * (head_dim + 3))


@dataclasses.dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    storages: dict[str, torch.Tensor]   # the whole buffer each view lives in, guards included
    # On an accelerator: the CPU storages they were moved from, same bits and views. A judgement
    # computing on the host reads these instead of copying the inputs back (judging/placement.py).
    host: "Inputs | None" = None
    # Once moved: the one uint8 buffer every storage is a view of (transfer.packed), so a copy
    # or a comparison of all of them is one kernel (launches are waits on a shared GPU).
    packed: torch.Tensor | None = None

    def tensors(self):
        return self.q, self.k, self.v

    def on(self, device: torch.device) -> "Inputs":
        """These inputs on `device`: themselves, their host copy, or moved there. Inputs born
        on the device (a counter case) are read back once and keep that copy as their host."""
        device = torch.device(device)
        if same_device(self.q.device, device):
            return self
        if self.host is not None and device.type == "cpu":
            return self.host
        moved = _moved(self, device)
        if device.type == "cpu":
            self.host = moved
        return moved

    def keep_host_copy(self, packed_on_host: torch.Tensor) -> None:
        """Adopt `packed_on_host`, a host copy of this device's packed buffer read back with
        other results (judge.py), as this case's host inputs: no transfer of their own."""
        storages = {name: _same_place(buf, self.packed, packed_on_host)
                    for name, buf in self.storages.items()}
        self.host = _viewed(self, storages, host=None, packed=packed_on_host)

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {name: buf.clone() for name, buf in self.storages.items()}

    def copy(self) -> "Inputs":
        """Fresh storages with the same bits and the same views (strides, offsets, padding),
        cloned on the device: what a new materialisation would give, without generating the
        values on the CPU and moving them again (the larger part of a GPU case's set-up)."""
        if self.packed is not None:
            packed = self.packed.clone()
            storages = {name: _same_place(buf, self.packed, packed)
                        for name, buf in self.storages.items()}
            return _viewed(self, storages, host=self.host, packed=packed)
        storages = {name: buf.clone() for name, buf in self.storages.items()}
        return _viewed(self, storages, host=self.host)


def _same_place(storage: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """The view of `new` at the bytes where `storage` lies in `old` (two packed buffers)."""
    start = storage.data_ptr() - old.data_ptr()
    size = storage.numel() * storage.element_size()
    return new[start:start + size].view(storage.dtype).view(storage.shape)


def changed_anywhere(inputs: Inputs, pristine: Inputs) -> torch.Tensor | None:
    """A 1-element bool tensor on the device: do `inputs`' packed bytes differ anywhere from
    `pristine`'s (their storages and the 0xFF bytes between them)? One comparison for all
    storages; None when either is not packed (then compare per storage: `changed_flags`)."""
    a, b = inputs.packed, pristine.packed
    if a is None or b is None or a.numel() != b.numel():
        return None
    # The buffer's size is a multiple of transfer.ALIGN: compared as int32, a quarter of the work.
    return (a.view(torch.int32) != b.view(torch.int32)).any().reshape(1)


def changed_flags(storages: dict[str, torch.Tensor], before: dict[str, torch.Tensor]) -> torch.Tensor:
    """One bool per storage, in `storages`' order: do its bits differ from `before`'s (NaN-safe)?
    Left on the device, unread: the caller reads it back with the run's other results
    (transfer.read_back), where a read per storage would each wait for the GPU."""
    if all(t.device.type == "cpu" for t in storages.values()):
        # On the CPU nothing waits: torch.equal per storage, a fraction of ne + any + stack.
        return torch.tensor([not torch.equal(as_bits(storages[n]), as_bits(before[n]))
                             for n in storages])
    return torch.stack([(as_bits(storages[n]) != as_bits(before[n])).any() for n in storages])


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """The same memory as integers of the element's width: bitwise comparison, NaN included."""
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def logical_values(case: AttentionCase, device="cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 q, k, v of the case's logical shapes, before rounding and layout: on the CPU from
    a torch_cpu case, on `device` from a counter case (the same bits either way)."""
    g = source(case.generator, case.data_seed, device)
    shapes = [case.shape(name) for name in "qkv"]
    if case.generator == "counter":
        # One draw for all three (the same stream positions, so the same bits, as three draws
        # in a row): a third of the kernel launches.
        sizes = [math.prod(shape) for shape in shapes]
        q, k, v = (t.view(shape) for t, shape in zip(g.normal((sum(sizes),)).split(sizes), shapes))
    else:
        q, k, v = (g.normal(shape) for shape in shapes)
    return _apply_profile(case, q, k, v, g)


def _apply_profile(case, q, k, v, g):
    """The value profile's changes to standard normal q, k, v; `g` draws what they choose at
    random (inputs/sources.py: the same calls, in the same order, for either source)."""
    profile = case.values
    if profile == "normal":
        pass
    elif profile == "large":
        # x64 each: scores ~ 4096 * N(0, 1), reaching ~1e4. Powers of two keep bf16 rounding exact.
        q, k = q * 64, k * 64
    elif profile == "near_constant":
        # Every key equals key 0 up to 1e-3 noise: rows are nearly uniform, the max barely moves.
        k = k[:, :, :1, :] + 1e-3 * k
    elif profile == "dominant_key":
        # q >= 0.5 everywhere and one key of all 4.0 per (batch, kv head): its score is ~5*sqrt(D)
        # above the others, so each row's softmax is close to one-hot on that key (when visible).
        q = q.abs() + 0.5
        if case.seq_k:
            j = g.integers(0, case.seq_k, (case.batch, case.kv_heads))
            k[torch.arange(case.batch, device=k.device)[:, None],
              torch.arange(case.kv_heads, device=k.device)[None, :], j] = 4.0
    elif profile == "zero_query_rows":
        rows = g.coin((case.batch, case.heads, case.seq_q))
        q = q.masked_fill(rows[..., None], 0.0)
    elif profile == "below_sentinel":
        # q = 1024 everywhere, key j = -1024 * m_j (m_j in 1..32): every score is a multiple of
        # -2**20 * D * scale, at most about -4e6, and exact in fp32 (and bf16/fp16) so equal m_j
        # tie exactly. Gaps between distinct keys are ~1e6, so each row is one-hot (or evenly
        # split over ties) on its smallest visible m_j and rounding cannot move the answer. A
        # kernel that masks with a finite sentinel such as -1e6 gives masked keys the larger score.
        q = torch.full_like(q, 1024.0)
        m = g.integers(1, 33, (case.batch, case.kv_heads, case.seq_k, 1)).float()
        k = (-1024.0 * m).expand_as(k).clone()
    elif profile in PROFILE_VALUES:        # the profiles sources.py builds
        q, k, v = PROFILE_VALUES[profile](case, q, k, v, g)
    else:  # guarded by AttentionCase validation
        raise AssertionError(profile)
    return q, k, v


def _layout_shapes(shape, layout: str):
    """(base shape, storage block shape, expanded?) of a (B, H, N, D) tensor in `layout`: the
    values stored (one batch or head element for a broadcast layout) and the block holding
    them between the guards."""
    B, H, N, D = shape
    if layout == "broadcast_batch":
        base_shape, expand = (1, H, N, D), True
    elif layout == "broadcast_heads":
        base_shape, expand = (B, 1, N, D), True
    else:
        base_shape, expand = (B, H, N, D), False
    b, h, n, d = base_shape
    if layout == "sliced":
        # rows 1, 3, 5, ... of a (b, h, 2n + 1, d + 3) block: NaN rows between and after every
        # sequence element, NaN columns past D, and a non-zero storage offset.
        inner = (b, h, 2 * n + 1, d + 3)
    elif layout == "last_dim_strided":
        inner = (b, h, n, 2 * d)
    elif layout == "transposed":
        inner = (b, n, h, d)
    else:
        inner = base_shape
    return base_shape, inner, expand


def _storage_numel(shape, layout: str) -> int:
    """Elements of the padded storage `_storage_and_view` places a (B, H, N, D) tensor in."""
    return math.prod(_layout_shapes(shape, layout)[1]) + 2 * guard_elements(shape[-1])


def _storage_and_view(logical: torch.Tensor, layout: str, dtype: torch.dtype, pad_value: float,
                      storage: torch.Tensor | None = None):
    """Place `logical` (B, H, N, D) into a padded storage on its device (or into `storage`, of
    `_storage_numel` elements of `dtype`); return (storage, view)."""
    B, H, N, D = logical.shape
    (b, h, n, d), inner, expand = _layout_shapes(logical.shape, layout)
    numel = math.prod(inner)
    guard = guard_elements(D)
    if storage is None:
        storage = torch.full((guard + numel + guard,), pad_value, dtype=dtype, device=logical.device)
    else:
        storage.fill_(pad_value)
    block = storage[guard:guard + numel].view(inner)
    if layout == "sliced":
        view = block[:, :, 1:2 * n:2, :d]
    elif layout == "last_dim_strided":
        view = block[..., ::2]
    elif layout == "transposed":
        view = block.transpose(1, 2)
    else:
        view = block
    view.copy_(logical[:b, :h].to(dtype))
    if expand:
        view = view.expand(B, H, N, D)
    return storage, view


def materialize(case: AttentionCase, device: str | torch.device = "cpu",
                pad_value: float = float("nan")) -> Inputs:
    """Deterministic inputs for `case` on `device`, bit-identical on every machine. On an
    accelerator a torch_cpu case's inputs keep the CPU storages they were moved from as `host`;
    a counter case's are computed there (`host` None until they are read back)."""
    dtype = torch_dtype(case.dtype)
    device = torch.device(device)
    if born_on_device(case, device):
        return _born_on(case, device, dtype, pad_value)
    storages, views = {}, {}
    for name, logical, layout in zip("qkv", logical_values(case), case.layout):
        storages[name], views[name] = _storage_and_view(logical, layout, dtype, pad_value)
    host = Inputs(views["q"], views["k"], views["v"], storages)
    return host if device.type == "cpu" else _moved(host, device)


def born_on_device(case: AttentionCase, device) -> bool:
    """Whether `case`'s values are computed on `device` itself (a counter case off the CPU)."""
    return case.generator == "counter" and torch.device(device).type != "cpu"


def _born_on(case: AttentionCase, device: torch.device, dtype: torch.dtype,
             pad_value: float) -> Inputs:
    """A counter case's inputs computed on `device`, in the packed storages `_moved` would have
    given (each on a 512-byte boundary, 0xFF between), without a host copy."""
    logical = logical_values(case, device)
    item = BY_NAME[case.dtype].itemsize
    numels = [_storage_numel(t.shape, layout) for t, layout in zip(logical, case.layout)]
    offsets, size = storage_offsets([n * item for n in numels])
    packed = torch.full((size,), FILL, dtype=torch.uint8, device=device)
    storages, views = {}, {}
    for name, t, layout, offset, numel in zip("qkv", logical, case.layout, offsets, numels):
        storage = packed[offset:offset + numel * item].view(dtype)
        storages[name], views[name] = _storage_and_view(t, layout, dtype, pad_value, storage)
    return Inputs(views["q"], views["k"], views["v"], storages, packed=packed)


def _moved(inputs: Inputs, device: torch.device) -> Inputs:
    """`inputs`' storages on `device` in one copy (transfer.packed_buffer_to: on a GPU shared by
    several processes each copy waits for this process's time slice), viewed there the same way.
    Each storage starts on a 512-byte boundary, as a separate allocation would, and the bytes
    between storages hold 0xFF (NaN in every float dtype), so a read past one storage's guard
    still finds NaN."""
    host = inputs if inputs.q.device.type == "cpu" else inputs.host
    packed, moved = packed_buffer_to(list(inputs.storages.values()), device)
    return _viewed(inputs, dict(zip(inputs.storages, moved)), host=host, packed=packed)


def moved_with(host: Inputs, extra: dict, device) -> tuple[Inputs, dict, dict]:
    """`host` (CPU inputs) and `extra` ({name: (storage, view)} on the CPU: dO, a forward's out
    and lse) on `device`, every storage in one transfer (a wait for a time-sliced GPU each),
    viewed there as on the CPU. Returns (inputs, {name: storage}, {name: view}) of the extras.
    Inputs and extras already on `device` (the CPU's, a counter case's) are returned as they are."""
    device = torch.device(device)
    if all(same_device(t.device, device)
           for t in [*host.storages.values(), *(s for s, _ in extra.values())]):
        return host, {n: s for n, (s, _) in extra.items()}, {n: v for n, (_, v) in extra.items()}
    names = list(host.storages) + list(extra)
    storages = list(host.storages.values()) + [s for s, _ in extra.values()]
    # The packed buffer also holds the extras, so these inputs are not `packed` (Inputs.copy
    # would copy dO, out and lse with them): each storage is a view of it all the same.
    _, moved = packed_buffer_to(storages, device)
    moved = dict(zip(names, moved))
    inputs = _viewed(host, {n: moved[n] for n in host.storages}, host=host, packed=None)
    views = {name: view_in(moved[name], storage, view) for name, (storage, view) in extra.items()}
    return inputs, {n: moved[n] for n in extra}, views


def view_in(there: torch.Tensor, storage: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """`view` of `storage`, taken of `there` (a copy of `storage`, which may itself start inside
    a larger allocation: transfer.packed_to): the same shape, strides and offset from its start."""
    offset = view.storage_offset() - storage.storage_offset()
    return there.as_strided(view.shape, view.stride(), there.storage_offset() + offset)


def _viewed(inputs: Inputs, storages: dict[str, torch.Tensor], *, host: Inputs | None,
            packed: torch.Tensor | None = None) -> Inputs:
    """Inputs over `storages` (copies of `inputs`' own) with `inputs`' views."""
    views = {name: view_in(storages[name], inputs.storages[name], t)
             for name, t in zip("qkv", inputs.tensors())}
    return Inputs(views["q"], views["k"], views["v"], storages, host=host, packed=packed)


def place(logical: torch.Tensor, layout: str, dtype: torch.dtype, device,
          pad_value: float = float("nan")) -> tuple[torch.Tensor, torch.Tensor]:
    """(storage, view): `logical` (B, H, N, D), rounded to `dtype` on the CPU, inside a padded
    storage in `layout`, moved to `device` in one piece and viewed there."""
    storage, view = _storage_and_view(logical.to("cpu"), layout, dtype, pad_value)
    storage = storage.to(device)
    return storage, storage.as_strided(view.shape, view.stride(), view.storage_offset())


def place_flat(values: torch.Tensor, device, pad_value: float = float("nan")):
    """(storage, view): a contiguous copy of `values` between NaN guards (lse, which kernels
    index with its own strides)."""
    guard = guard_elements(0)
    storage = torch.full((guard + values.numel() + guard,), pad_value, dtype=values.dtype,
                         device=device)
    view = storage[guard:guard + values.numel()].view(values.shape)
    view.copy_(values)
    return storage, view


# The upstream gradient dO comes from its own generator, seeded from the data seed mixed with
# this constant (the golden-ratio bits, below 2^63 so the XOR stays a valid seed): q, k and v
# keep the bits every existing fixture pins, and dO is as deterministic as they are.
DOUT_SEED_MIX = 0x1E3779B97F4A7C15


def materialize_dout(case: AttentionCase, device: str | torch.device = "cpu",
                     pad_value: float = float("nan")) -> tuple[torch.Tensor, torch.Tensor]:
    """(storage, view): the case's upstream gradient dO, unit-variance values from the case's
    generator (a stream of its own) rounded to the case's dtype, in q's layout (so a transposed
    or sliced q comes with a dO of the same form) inside NaN-guarded storage, bit-identical on
    every machine. A counter case's dO is computed on `device` itself."""
    if case.generator != "torch_cpu":
        logical = source(case.generator, case.data_seed ^ DOUT_SEED_MIX, device).normal(case.shape("q"))
        return _storage_and_view(logical, case.layout[0], torch_dtype(case.dtype), pad_value)
    logical = _dout_values(case.data_seed, tuple(case.shape("q")))
    return place(logical, case.layout[0], torch_dtype(case.dtype), device, pad_value)


@functools.lru_cache(maxsize=2)
def _dout_values(data_seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    """dO's standard normal values, kept for the next call: a gradient judgement asks for the
    same dO two to four times (each backward run, the oracles), and the CPU's randn of a large
    case costs milliseconds each time. Never handed out: `place` copies it into new storage."""
    return source("torch_cpu", data_seed ^ DOUT_SEED_MIX).normal(shape)


def inputs_sha256(inputs: Inputs) -> str:
    """Hash of the logical input values (not padding or layout): what a fixture pins."""
    h = hashlib.sha256()
    for t in inputs.on(torch.device("cpu")).tensors():
        h.update(str(tuple(t.shape)).encode())
        h.update(str(t.dtype).encode())
        h.update(as_bits(t.detach().to("cpu").contiguous()).numpy().tobytes())
    return h.hexdigest()
