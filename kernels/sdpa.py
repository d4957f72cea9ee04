"""PyTorch's scaled_dot_product_attention as an implementation under test, with lse beside it.

SDPA returns only the output, so the lse is computed here, in fp32 from the same inputs: the
logsumexp of the scaled, masked scores. It is therefore an fp32 reference value, not SDPA's own
internal statistic (which the public API does not expose).

Causal: top-left is SDPA's `is_causal=True` (key j visible to query i iff j <= i); bottom-right
(j <= i + Nk - Nq, FlashAttention >= 2.1) is an explicit boolean mask, tril with diagonal Nk - Nq.

Rows with no visible key (bottom-right with Nq > Nk): measured on torch 2.13.0+cpu, SDPA returns
0 for them (default dispatch, and the MATH and FLASH_ATTENTION backends alike, for fp32, bf16 and
fp16); older releases' math path gave NaN (softmax of an all -inf row). We do not rely on either:
such rows are set to out 0 and lse -inf explicitly, the project's convention.

Zero lengths (torch 2.13.0+cpu): Nq == 0 returns an empty (B, H, 0, D) tensor and Nk == 0 returns
zeros, with or without is_causal; the adapter still forces Nk == 0 to out 0 / lse -inf itself.

Per backend: besides `sdpa` (default dispatch), `sdpa_flash`, `sdpa_efficient`, `sdpa_cudnn` and
`sdpa_math` run one backend each under `torch.nn.attention.sdpa_kernel`. Default dispatch silently
falls back to another backend, so a bug in one backend (cuDNN leaking a masked key through a
boolean mask, H200) shows only for the inputs that happen to pick it; restricting dispatch fuzzes
each backend on everything it accepts. What each accepts is not written down by hand: it is
probed at import, on this torch and this device, with tiny cases (`probe_backend`), and the
declaration names the torch version and device it was probed on. Names the engine reads:

    BACKEND_IMPLS  the per-backend Implementations that can run here (registered by kernels/)
    UNAVAILABLE    name -> why a backend is not registered here (e.g. EFFICIENT on a CPU build)
    PROBES         name -> ProbeResult: every probe that failed, for listings
    REFUSALS       name -> substrings of the RuntimeError a backend raises at call time for a
                   declared case it cannot run (a limit no other Capabilities field can express);
                   the same tuple is each implementation's `Capabilities.refusals`, so campaigns
                   count such draws as refused (never passes, never crashes)
    CONFIG_SPACE   the configuration axis: how bottom-right causality is passed (mask_form)

Mask form: the contract leaves open how bottom-right causality reaches SDPA. `config={"mask_form":
"bool"}` passes a boolean keep-mask, `"float"` an additive 0/-inf mask in q's dtype. They are
different code paths in the backends (measured on the H200, torch 2.11: CUDNN_ATTENTION with a
boolean mask let a masked key through, as a float mask it was exact), so each per-backend
implementation declares the forms it runs as `Capabilities(configs={"mask_form": ...})`: the
strategies draw one per case, shrink toward "bool", and the case records it. Top-left is always
SDPA's own `is_causal`, for which no mask is built, so the form only matters for bottom-right.

A case that names no configuration runs an implementation's default (the contract's rule), here
the first declared form, "bool": so the configless regression files replay on every backend too.
The default `sdpa` declares no configuration: it always passes a boolean mask (what a user calling
SDPA with a keep-mask gets), and its mutants keep its calling convention.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fuzzattn.contract import Capabilities, Implementation, refuse
from fuzzattn.contract.dtypes import DTYPES
from fuzzattn.kernels.sdpa_defects import KNOWN_DEFECTS

MAX_HEAD_DIM = 256

# The configuration axis. The engine passes `config=` (one point of the declared space) to an
# implementation whose Capabilities declare one: the per-backend implementations below, each with
# the forms its probes ran. sdpa_forward takes it from any caller; None means DEFAULT_MASK_FORM.
CONFIG_SPACE = {"mask_form": ("bool", "float")}
DEFAULT_MASK_FORM = "bool"


CAPS = Capabilities(
    dtypes={"float32", "bfloat16", "float16"},
    head_dims=None,
    max_head_dim=MAX_HEAD_DIM,
    causal=("top_left", "bottom_right"),
    gqa=True,
    strides="any",
    zero_length=True,
    returns_lse=True,
    # Gradients by autograd of the forward. (The CPU FLASH backward once looked broken here, dv
    # off by ~8e10 on values=below_sentinel: that was the gradient rule, which allowed linear
    # rather than exponential error for P recomputed from an lse at scores ~3e8; see
    # tolerance.grad_noise.)
    backward=True,
    fp32_matmul="ieee",
    # CPU SDPA reruns are bitwise identical; CUDA flash/cuDNN forwards are too (no atomics in
    # the forward pass).
    deterministic=True,
    out_buffer=False,
    # CPU autograd reruns are bitwise identical (measured: every gradient test here). On CUDA the
    # flash and memory-efficient backwards accumulate dq with atomic adds (the FA #359 class), so
    # reruns may differ in the last bits: not declared there (not yet measured on the H200).
    deterministic_backward=not torch.cuda.is_available(),
    known_defects=KNOWN_DEFECTS["sdpa"],       # CUDA only (kernels/sdpa_defects.py)
)


def sdpa_forward(q, k, v, *, causal, scale, config=None, backend=None, caps=CAPS):
    """(out (B,Hq,Nq,D) in q's dtype, lse (B,Hq,Nq) float32) from F.scaled_dot_product_attention.

    `config`: one point of CONFIG_SPACE (None: a boolean mask). `backend` and `caps` are bound by
    this module's per-backend implementations (functools.partial): the SDPBackend that dispatch is
    restricted to (None: default dispatch) and the declaration its inputs are checked against."""
    causal, scale = caps.check_inputs(q, k, v, causal=causal, scale=scale)
    mask_form = _mask_form(config, caps)
    heads, seq_q = q.shape[1], q.shape[2]
    kv_heads, seq_k = k.shape[1], k.shape[2]

    # visible[i, j]: may query i see key j? None when every key is visible.
    visible = _visible_keys(seq_q, seq_k, causal, q.device)

    # CUDA flash backend (torch 2.11 on an H200) faults with "misaligned address" when a base
    # pointer is not 16-byte aligned (fp16, storage offset 91 elements); the fault poisons the
    # CUDA context and ends the whole run. Copy such inputs to fresh (aligned) memory: this moves
    # bytes, never changes values, and leaves SDPA's arithmetic under test.
    q, k, v = (_aligned_for_cuda(t) for t in (q, k, v))
    gqa = dict(enable_gqa=True) if kv_heads != heads else {}   # torch >= 2.5: no k/v copy
    with _dispatch_to(backend):
        if causal == "bottom_right":
            mask = _attn_mask(visible, mask_form, q.dtype)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal == "top_left",
                                                 scale=scale, **gqa)

    # lse in fp32 from the inputs; GQA by broadcasting (B, Hkv, G, Nq, D) against (B, Hkv, 1, Nk, D).
    q5 = q.unflatten(1, (kv_heads, heads // kv_heads)).float()
    scores = (q5 @ k.unsqueeze(2).float().transpose(-1, -2)) * scale
    if visible is not None:
        scores = scores.masked_fill(~visible, -math.inf)
    if seq_k == 0:
        lse = torch.full(scores.shape[:-1], -math.inf, dtype=torch.float32, device=q.device)
    else:
        lse = torch.logsumexp(scores, dim=-1)      # all -inf rows give -inf, not NaN
    lse = lse.flatten(1, 2)

    # Rows that see no key: the convention is out 0, lse -inf, whatever SDPA chose to return.
    # Query i sees key j iff j - i <= offset, so the rows seeing none are the first -offset
    # (bottom-right with Nq > Nk), or all of them without keys: known from the lengths, where
    # reading the mask back would make every causal call wait for the GPU.
    blank = seq_q if seq_k == 0 else (max(0, seq_q - seq_k) if causal == "bottom_right" else 0)
    if blank:
        out = out.clone()
        out[:, :, :blank] = 0.0
        lse = lse.clone()
        lse[:, :, :blank] = -math.inf
    return out, lse


def _mask_form(config, caps: Capabilities) -> str:
    """The mask form a config asks for; anything outside CONFIG_SPACE is refused in one line.
    No config (a case naming none runs the implementation's default, by the contract): the first
    form `caps` declares, which is the boolean one wherever it runs, else DEFAULT_MASK_FORM."""
    if config is None:
        return dict(caps.configs).get("mask_form", (DEFAULT_MASK_FORM,))[0]
    if not isinstance(config, dict):
        refuse("config", config, "None or a dict over CONFIG_SPACE")
    unknown = sorted(set(config) - set(CONFIG_SPACE))
    if unknown:
        refuse("config key", unknown[0], sorted(CONFIG_SPACE))
    form = config.get("mask_form", DEFAULT_MASK_FORM)
    if form not in CONFIG_SPACE["mask_form"]:
        refuse("config['mask_form']", form, CONFIG_SPACE["mask_form"])
    return form


def _attn_mask(visible: torch.Tensor, mask_form: str, dtype: torch.dtype) -> torch.Tensor:
    """visible as SDPA's attn_mask: the boolean keep-mask itself, or an additive float mask (0 where
    visible, -inf where not) in q's dtype, the only float dtype SDPA accepts for it."""
    if mask_form == "bool":
        return visible
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, -math.inf)


def _dispatch_to(backend):
    """Restrict SDPA to one backend for the call (None: torch's default dispatch)."""
    return contextlib.nullcontext() if backend is None else sdpa_kernel(backend)


def _visible_keys(seq_q: int, seq_k: int, causal: str, device) -> torch.Tensor | None:
    """(Nq, Nk) bool, True where query i may see key j; None when every key is visible.
    Built here, not borrowed from the oracle: a mask bug shared by both sides would be invisible
    to the differential. Key j is visible to query i iff j - i <= offset (0 for top-left,
    Nk - Nq for bottom-right)."""
    if causal == "none":
        return None
    offset = 0 if causal == "top_left" else seq_k - seq_q
    rows = torch.arange(seq_q, device=device)[:, None]
    cols = torch.arange(seq_k, device=device)[None, :]
    return cols - rows <= offset


def _aligned_for_cuda(t: torch.Tensor) -> torch.Tensor:
    """t itself, or a contiguous copy when on CUDA its base or a row stride is not 16-byte aligned."""
    if t.device.type != "cuda":
        return t
    size = t.element_size()
    misaligned = t.data_ptr() % 16 != 0 or any(
        (stride * size) % 16 for stride, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1)
    # clone, not contiguous(): a contiguous view at an odd storage offset would come back as is.
    return t.clone(memory_format=torch.contiguous_format) if misaligned else t


IMPL = Implementation(
    name="sdpa",
    fn=sdpa_forward,
    caps=CAPS,
    description="torch.nn.functional.scaled_dot_product_attention (is_causal for top-left, a "
                "boolean tril mask for bottom-right), lse computed beside it in fp32.",
    sources=(__file__,),
)


# -- one backend each, declared by probing ----------------------------------------------------------
BACKENDS = {
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa_math": SDPBackend.MATH,
}

# What SDPA raises when the backend it is restricted to cannot run a case: "No available kernel"
# (CUDA, torch 2.11 on the H200: FLASH with is_causal and Nq != Nk, EFFICIENT with enable_gqa,
# cuDNN for some head dims and shapes) and "No viable backend for scaled_dot_product_attention"
# (CPU, torch 2.13: a backend the CPU build does not have).
NO_KERNEL_MESSAGES = ("No available kernel", "No viable backend")

# Head dims probed: those fuzzattn.strategies.lengths draws (powers of two, then odd sizes) and the larger
# ones up to MAX_HEAD_DIM where fused kernels change tile configuration.
PROBE_HEAD_DIMS = (1, 3, 8, 16, 24, 32, 40, 48, 64, 72, 80, 96, 128, 160, 192, 256)

# Probes call sdpa_forward itself (alignment copies, masks and lse included) under a declaration
# that lets every input through, so only the backend can refuse.
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
    """The device the judge runs on (fuzzattn.judge.judge.default_device, not imported: it loads the
    oracle, which implementation code must not)."""
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


def _run_probe(backend, dtype: str, device: str, *, batch=1, heads=2, kv_heads=2, seq_q=4,
               seq_k=4, head_dim=64, causal=False, mask_form=DEFAULT_MASK_FORM,
               layout="contiguous") -> str | None:
    """None when the backend runs this tiny case, else the error's first line. Only the errors a
    backend raises for inputs it cannot take are caught (RuntimeError, NotImplementedError);
    anything else is a bug in this module and propagates."""
    q, k, v = _probe_tensors(dtype, device, batch=batch, heads=heads, kv_heads=kv_heads,
                             seq_q=seq_q, seq_k=seq_k, head_dim=head_dim, layout=layout)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # sdpa_kernel's "kernel not used because ..." notes
            sdpa_forward(q, k, v, causal=causal, scale=head_dim ** -0.5,
                         config={"mask_form": mask_form}, backend=backend, caps=_PROBE_CAPS)
            if device == "cuda":
                torch.cuda.synchronize()        # an asynchronous error belongs to this probe
    except (RuntimeError, NotImplementedError) as exc:
        lines = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return None


def probe_backend(backend, device: str | None = None) -> ProbeResult:
    """What `backend` accepts on this torch and `device`, from tiny cases (well under a second on
    the CPU). A dtype is declared when the basic case (B=1 H=2 Nq=Nk=4 D=64) runs in it; every
    other property is declared only when it runs in every declared dtype. A causal alignment that
    runs square but not with Nq != Nk is declared with causal_equal_lengths (drawn square)."""
    device = device or _probe_device()
    where = _where(device)
    failed: list[tuple[str, str]] = []

    def attempt(label, dtype, **kwargs) -> bool:
        error = _run_probe(backend, dtype, device, **kwargs)
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
    if not runs("transposed", layout="transposed") or not runs("broadcast", batch=2, layout="broadcast"):
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
        # ieee: no backend is known to round fp32 operands to TF32 (measured on the H200: fp32
        # EFFICIENT off by 2 ulps with one key, MATH exact; TF32 would be ~2^-11 relative).
        fp32_matmul="ieee",
        # Forward passes of all four backends reduce without atomics: bitwise-identical reruns.
        deterministic=True,
        out_buffer=False,
        # What the backend raises for a declared case it cannot run (FLASH and is_causal with
        # Nq != Nk, say): counted as refused by the engine, never as a pass or a crash.
        refusals=NO_KERNEL_MESSAGES,
        # The mask forms that ran; none declared without bottom-right, where the form is unused.
        configs={"mask_form": forms} if forms else {},
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
    """Probes are ~100 tiny calls: one intra-op thread each. With torch's default thread pool on a
    loaded machine, every tiny CPU op waits for its threads (measured: 11 ms per probe call with 2
    shared cores under load, against 0.25 ms single-threaded), and the probes took seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _register(device: str | None = None):
    """(implementations that run here, UNAVAILABLE, PROBES, REFUSALS), probing each backend once."""
    impls, unavailable, probes, refusals = [], {}, {}, {}
    for name, backend in BACKENDS.items():
        with _one_cpu_thread():
            result = probe_backend(backend, device)
        probes[name] = result
        if result.caps is None:
            unavailable[name] = result.reason
            continue
        caps = dataclasses.replace(result.caps, known_defects=KNOWN_DEFECTS.get(name, ()))
        impls.append(Implementation(
            name=name,
            fn=functools.partial(sdpa_forward, backend=backend, caps=caps),
            caps=caps,
            description=(f"F.scaled_dot_product_attention restricted to SDPBackend.{backend.name} "
                         f"(sdpa_kernel); declaration probed on {result.where}: "
                         f"{_summary(result.caps)}."),
            sources=(__file__,),
        ))
        refusals[name] = result.caps.refusals
    return tuple(impls), unavailable, probes, refusals


# Conditional limits no other Capabilities field can express (a backend's size or memory limits,
# say) reach the engine as the backend's own RuntimeError at call time; each
# implementation declares their substrings as `Capabilities.refusals` (REFUSALS lists them by
# name), and the engine counts a draw refused that way (Campaign.refused), never as a pass.
BACKEND_IMPLS, UNAVAILABLE, PROBES, REFUSALS = _register()
