"""SDPA one backend at a time: which backends run here, and what each accepts, found by probing.

Besides `sdpa` (default dispatch, kernels/sdpa.py), `sdpa_flash`, `sdpa_efficient`, `sdpa_cudnn`
and `sdpa_math` run one backend each under `torch.nn.attention.sdpa_kernel`. Default dispatch
silently falls back to another backend, so a bug in one backend shows only for the inputs that
happen to pick it; restricting dispatch fuzzes each backend on everything it accepts. What each
accepts is not written down by hand: `register` probes it at import, on this torch and this
device, with tiny cases (`probe_backend`), and each declaration names the torch version and
device it was probed on. kernels/sdpa.py re-exports what `register` returns:

    BACKEND_IMPLS  the per-backend Implementations that can run here (registered by kernels/)
    UNAVAILABLE    name -> why a backend is not registered here (e.g. EFFICIENT on a CPU build)
    PROBES         name -> ProbeResult: every probe that failed, for listings
    REFUSALS       name -> substrings of the RuntimeError a backend raises at call time for a
                   declared case it cannot run (a limit no other Capabilities field can express);
                   the same tuple is each implementation's `Capabilities.refusals`, so campaigns
                   count such draws as refused (never passes, never crashes)

Mask form, the configuration axis (CONFIG_SPACE): how bottom-right causality reaches SDPA.
`config={"mask_form": "bool"}` passes a boolean keep-mask, `"float"` an additive 0/-inf mask in
q's dtype. They are different code paths in the backends (on CUDA, cuDNN lets a masked key
through a boolean mask and not a float one: kernels/sdpa_defects.py), so each per-backend
implementation declares the forms its probes ran as `Capabilities(configs={"mask_form": ...})`:
the strategies draw one per case, shrink toward "bool", and the case records it. Top-left is
always SDPA's own `is_causal`, for which no mask is built, so the form only matters for
bottom-right. A case that names no configuration runs an implementation's default (the
contract's rule), the first declared form, "bool": so the configless regression files replay on
every backend too. The default `sdpa` declares no configuration: it always passes a boolean mask
(what a user calling SDPA with a keep-mask gets), and its mutants keep its calling convention.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings

import torch
from torch.nn.attention import SDPBackend

from fuzzattn.contract import Capabilities, Implementation
from fuzzattn.contract.dtypes import DTYPES
from fuzzattn.kernels import sdpa_defects
from fuzzattn.kernels.sdpa_defects import KNOWN_DEFECTS

MAX_HEAD_DIM = 256

CONFIG_SPACE = {"mask_form": ("bool", "float")}
DEFAULT_MASK_FORM = "bool"

BACKENDS = {
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa_math": SDPBackend.MATH,
}

# What SDPA raises when the backend it is restricted to cannot run a case: "No available kernel"
# on CUDA (FLASH with is_causal and Nq != Nk, EFFICIENT with enable_gqa, cuDNN for some head dims
# and shapes) and "No viable backend for scaled_dot_product_attention" on a CPU build (a backend
# the build does not have).
NO_KERNEL_MESSAGES = ("No available kernel", "No viable backend")

# Head dims probed: those fuzzattn.strategies.lengths draws (powers of two, then odd sizes) and
# the larger ones up to MAX_HEAD_DIM where fused kernels change tile configuration.
PROBE_HEAD_DIMS = (1, 3, 8, 16, 24, 32, 40, 48, 64, 72, 80, 96, 128, 160, 192, 256)

# Probes call the adapter itself (alignment copies, masks and lse included) under a declaration
# that lets every input through, so only the backend can refuse.
# cuDNN's half-precision attention builds and caches an execution plan per new shape: a shape's
# first call ~125 ms, later ones ~1 ms (benchmarks/sdpa_shapes.py, docs in REPORT.md).
PLANNED_DTYPES = frozenset({"bfloat16", "float16"})
# Shapes per campaign there: 16 first calls (a few seconds of plans) buy a campaign's shapes
# variety without a plan per case.
PLANNED_SHAPES = 16

_PROBE_CAPS = Capabilities(dtypes=set(DTYPES), head_dims=None, max_head_dim=MAX_HEAD_DIM,
                           causal=("top_left", "bottom_right"), gqa=True, strides="any",
                           zero_length=True)
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    backend: str                              # SDPBackend member name
    where: str                                # "torch <version> on <device>"
    caps: Capabilities | None                 # None: the backend runs nothing here
    reason: str = ""                          # why caps is None
    failed: tuple[tuple[str, str], ...] = ()     # (probe, one-line error) for every failed probe


def _probe_device() -> str:
    """The device the judge runs on (fuzzattn.judgement.judge.default_device, not imported: it loads
    the oracle, which implementation code must not)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def _where(device: str) -> str:
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return f"torch {torch.__version__} on {name}"


def _probe_tensors(dtype, device, *, batch, heads, kv_heads, seq_q, seq_k, head_dim, layout):
    """Small deterministic q, k, v in fresh (hence aligned) memory, laid out as asked:
    contiguous, transposed ((B, N, H, D) storage), broadcast (k/v stride 0 over the batch) or
    last_dim_strided (every other element of a (.., 2D) row)."""
    g = torch.Generator().manual_seed(0)
    shapes = ((batch, heads, seq_q, head_dim), (batch, kv_heads, seq_k, head_dim),
              (batch, kv_heads, seq_k, head_dim))
    out = []
    for i, (b, h, n, d) in enumerate(shapes):
        if layout == "transposed":
            t = torch.randn(b, n, h, d, generator=g).transpose(1, 2)
        elif layout == "last_dim_strided":
            t = torch.randn(b, h, n, 2 * d, generator=g)[..., ::2]
        elif layout == "broadcast" and i > 0:
            t = torch.randn(1, h, n, d, generator=g).expand(b, h, n, d)
        else:
            t = torch.randn(b, h, n, d, generator=g)
        # Moved to the device and dtype with its strides kept (empty_strided + copy_: a plain
        # .to() may return a contiguous copy); a stride-0 broadcast is rebuilt there with expand.
        if layout == "broadcast" and i > 0:
            t = t[:1].to(device=device, dtype=_TORCH_DTYPES[dtype]).expand(b, h, n, d)
        else:
            t = torch.empty_strided(t.shape, t.stride(), dtype=_TORCH_DTYPES[dtype],
                                    device=device).copy_(t)
        out.append(t)
    return out


def _run_probe(forward, backend, dtype: str, device: str, *, batch=1, heads=2, kv_heads=2,
               seq_q=4, seq_k=4, head_dim=64, causal=False, mask_form=DEFAULT_MASK_FORM,
               layout="contiguous") -> str | None:
    """None when `forward` restricted to `backend` runs this tiny case, else the error's first
    line. Only the errors a backend raises for inputs it cannot take are caught (RuntimeError,
    NotImplementedError); anything else is a bug in the adapter and propagates."""
    q, k, v = _probe_tensors(dtype, device, batch=batch, heads=heads, kv_heads=kv_heads,
                             seq_q=seq_q, seq_k=seq_k, head_dim=head_dim, layout=layout)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # sdpa_kernel's "kernel not used because ..." notes
            forward(q, k, v, causal=causal, scale=head_dim ** -0.5,
                    config={"mask_form": mask_form}, backend=backend, caps=_PROBE_CAPS)
            if device == "cuda":
                torch.cuda.synchronize()        # an asynchronous error belongs to this probe
    except (RuntimeError, NotImplementedError) as exc:
        lines = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return None


def probe_backend(forward, backend, device: str | None = None) -> ProbeResult:
    """What `backend` accepts through `forward` (kernels/sdpa.py's sdpa_forward) on this torch
    and `device`, from tiny cases. A dtype is declared when the basic case (B=1 H=2 Nq=Nk=4
    D=64) runs in it; every other property is declared only when it runs in every declared dtype.
    A causal alignment that runs square but not with Nq != Nk is declared with
    causal_equal_lengths (drawn square)."""
    device = device or _probe_device()
    where = _where(device)
    failed: list[tuple[str, str]] = []

    def attempt(label, dtype, **kwargs) -> bool:
        error = _run_probe(forward, backend, dtype, device, **kwargs)
        if error is not None:
            failed.append((f"{label} {dtype}", error))
        return error is None

    dtypes = [d for d in DTYPES if attempt("basic", d)]
    if not dtypes:
        return ProbeResult(backend.name, where, None, reason=f"{failed[0][1]} ({where})",
                           failed=tuple(failed))

    def runs(label, **kwargs) -> bool:
        return all([attempt(label, d, **kwargs) for d in dtypes])   # a list: probe every dtype

    dims = [d for d in PROBE_HEAD_DIMS if runs(f"head_dim={d}", head_dim=d)]
    causal, square_causal = [], False
    if runs("top_left Nq=Nk", causal="top_left"):
        causal.append("top_left")
        rectangular = [runs(f"top_left Nq={nq} Nk={nk}", causal="top_left", seq_q=nq, seq_k=nk)
                       for nq, nk in ((3, 5), (5, 3))]
        square_causal = not all(rectangular)      # declared: causal cases are drawn square
    # Bottom-right is a mask: a form is declared when it runs Nq < Nk and Nq > Nk (rows with no
    # visible key) in every declared dtype; bottom-right is declared when some form does, and the
    # forms that do become the configuration space the engine draws from (bool first when it runs:
    # the simplest, and the form default dispatch is called with).
    forms = tuple(form for form in CONFIG_SPACE["mask_form"]
                  if all([runs(f"bottom_right {form} Nq={nq} Nk={nk}", causal="bottom_right",
                               mask_form=form, seq_q=nq, seq_k=nk) for nq, nk in ((3, 5), (5, 3))]))
    if forms:
        causal.append("bottom_right")
    gqa = runs("gqa H=4/2", heads=4, kv_heads=2)
    zero_length = all([runs(f"zero length Nq={nq} Nk={nk}", seq_q=nq, seq_k=nk)
                       for nq, nk in ((0, 4), (4, 0))])
    if not runs("transposed", layout="transposed") or not runs("broadcast", batch=2,
                                                                layout="broadcast"):
        strides = "contiguous"
    elif not runs("last_dim_strided", layout="last_dim_strided"):
        strides = "unit_last"
    else:
        strides = "any"
    every_dim = len(dims) == len(PROBE_HEAD_DIMS)
    caps = Capabilities(
        dtypes=set(dtypes),
        # Every probed dim runs: any dim up to MAX_HEAD_DIM, like `sdpa`; otherwise exactly the
        # dims seen running (the only ones the fuzzer draws, and all check_inputs lets through).
        head_dims=None if every_dim else frozenset(dims),
        max_head_dim=MAX_HEAD_DIM,
        causal=tuple(causal),
        causal_equal_lengths=square_causal,
        gqa=gqa,
        strides=strides,
        zero_length=zero_length,
        returns_lse=True,
        # Gradients by autograd for MATH, exact wherever measured; the other backends' gradients
        # are judged through `sdpa`'s default dispatch.
        backward=backend == SDPBackend.MATH,
        # No backend rounds fp32 operands to TF32 (ulps, not 2^-11: docs/CALIBRATION.md#tf32).
        fp32_matmul="ieee",
        # Forward passes of all four backends reduce without atomics: bitwise-identical reruns.
        deterministic=True,
        out_buffer=False,
        # What the backend raises for a declared case it cannot run (FLASH and is_causal with
        # Nq != Nk, say): counted as refused by the engine, never as a pass or a crash.
        refusals=NO_KERNEL_MESSAGES,
        # The mask forms that ran; none declared without bottom-right, where the form is unused.
        configs={"mask_form": forms} if forms else {},
        # cuDNN builds an execution plan per new shape (benchmarks/sdpa_shapes.py).
        plans_per_shape=PLANNED_DTYPES if backend == SDPBackend.CUDNN_ATTENTION else (),
        palette_shapes=PLANNED_SHAPES,
    )
    return ProbeResult(backend.name, where, caps, failed=tuple(failed))


def _summary(caps: Capabilities) -> str:
    dims = (f"head dims 1..{caps.max_head_dim}" if caps.head_dims is None
            else "head dims " + ",".join(map(str, sorted(caps.head_dims))))
    return (f"{'/'.join(d for d in DTYPES if d in caps.dtypes)}; {dims}; "
            f"causal {'+'.join(caps.causal) or 'none'}"
            f"{' (Nq == Nk only)' if caps.causal_equal_lengths else ''}; "
            f"gqa {'yes' if caps.gqa else 'no'}; "
            f"strides {caps.strides}; zero length {'yes' if caps.zero_length else 'no'}"
            + "".join(f"; {name} {'/'.join(choices)}" for name, choices in caps.configs))


@contextlib.contextmanager
def _one_cpu_thread():
    """Probes are ~100 tiny calls: one intra-op thread each. With torch's default thread pool on
    a loaded machine, every tiny CPU op waits for its threads, many times the op itself."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def register(forward, device: str | None = None):
    """(implementations that run here, UNAVAILABLE, PROBES, REFUSALS), probing each backend once
    through `forward` (sdpa_forward, whose `backend` and `caps` each implementation binds)."""
    impls, unavailable, probes, refusals = [], {}, {}, {}
    sources = (forward.__code__.co_filename, __file__, sdpa_defects.__file__)
    for name, backend in BACKENDS.items():
        with _one_cpu_thread():
            result = probe_backend(forward, backend, device)
        probes[name] = result
        if result.caps is None:
            unavailable[name] = result.reason
            continue
        caps = dataclasses.replace(result.caps, known_defects=KNOWN_DEFECTS.get(name, ()))
        impls.append(Implementation(
            name=name,
            fn=functools.partial(forward, backend=backend, caps=caps),
            caps=caps,
            description=(f"F.scaled_dot_product_attention restricted to SDPBackend.{backend.name} "
                         f"(sdpa_kernel); declaration probed on {result.where}: "
                         f"{_summary(result.caps)}."),
            sources=sources,
        ))
        refusals[name] = result.caps.refusals
    return tuple(impls), unavailable, probes, refusals
