"""PyTorch's scaled_dot_product_attention as an implementation under test, with lse beside it.

SDPA returns only the output, so the lse is computed here, in fp32 from the same inputs: the
logsumexp of the scaled, masked scores. It is therefore an fp32 reference value, not SDPA's own
internal statistic (which the public API does not expose).

Causal: top-left is SDPA's `is_causal=True` (key j visible to query i iff j <= i); bottom-right
(j <= i + Nk - Nq, FlashAttention >= 2.1) is an explicit mask, tril with diagonal Nk - Nq, passed
as a boolean keep-mask or an additive float mask (the mask form, kernels/sdpa_backends.py).

Rows with no visible key (bottom-right with Nq > Nk) and Nk == 0: what SDPA returns for them
differs between releases and backends (0 or NaN), so such rows are set to out 0 and lse -inf
here, the project's convention.

`IMPL` is SDPA under torch's default dispatch. `BACKEND_IMPLS` restrict it to one backend each,
declared by probing at import (kernels/sdpa_backends.py, whose results are re-exported here with
UNAVAILABLE, PROBES and REFUSALS).
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from fuzzattn.contract import Capabilities, Implementation, refuse
from fuzzattn.kernels import sdpa_backends, sdpa_defects
from fuzzattn.kernels.sdpa_backends import CONFIG_SPACE, DEFAULT_MASK_FORM, MAX_HEAD_DIM
from fuzzattn.kernels.sdpa_defects import KNOWN_DEFECTS

CAPS = Capabilities(
    dtypes={"float32", "bfloat16", "float16"},
    head_dims=None,
    max_head_dim=MAX_HEAD_DIM,
    causal=("top_left", "bottom_right"),
    gqa=True,
    strides="any",
    zero_length=True,
    returns_lse=True,
    backward=True,                   # gradients by autograd of the forward
    fp32_matmul="ieee",
    # CPU SDPA reruns are bitwise identical; CUDA flash/cuDNN forwards are too (no atomics in
    # the forward pass).
    deterministic=True,
    out_buffer=False,
    # CPU autograd reruns are bitwise identical. On CUDA the flash and memory-efficient
    # backwards accumulate dq with atomic adds (the FA #359 class), so reruns may differ in the
    # last bits: not declared there.
    deterministic_backward=not torch.cuda.is_available(),
    known_defects=KNOWN_DEFECTS["sdpa"],       # CUDA only (kernels/sdpa_defects.py)
    # On CUDA the default dispatch picks cuDNN for bf16/fp16, which plans per new shape.
    plans_per_shape=sdpa_backends.PLANNED_DTYPES if torch.cuda.is_available() else (),
    palette_shapes=sdpa_backends.PLANNED_SHAPES,
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

    # The CUDA flash backend faults with "misaligned address" on a base pointer that is not
    # 16-byte aligned, and the fault poisons the CUDA context for the whole run. Copy such inputs
    # to fresh (aligned) memory: this moves bytes, never values, and leaves SDPA's arithmetic
    # under test.
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
    sources=(__file__, sdpa_backends.__file__, sdpa_defects.__file__),
)


# One implementation per SDPA backend that runs here, each declared by probing it through
# sdpa_forward; the backends' runtime refusals are each one's `Capabilities.refusals`, so the
# engine counts a draw refused that way (Campaign.refused), never as a pass.
BACKEND_IMPLS, UNAVAILABLE, PROBES, REFUSALS = sdpa_backends.register(sdpa_forward)
