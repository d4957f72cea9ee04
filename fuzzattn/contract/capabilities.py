"""Capabilities: what an implementation declares it supports, stated once.

The fuzzer draws only inside a declaration (strategies read it), the judge skips what is outside
it, and a kernel validates the tensors it is handed with `Capabilities.check_inputs`, so the same
object says what a kernel accepts everywhere. Anything outside must be refused with an exception
carrying a one-line message (`refuse` raises the standard one).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch

from fuzzattn.contract.case import CAUSAL_ALIGNMENTS, AttentionCase
from fuzzattn.contract.dtypes import DTYPES, of_torch
from fuzzattn.contract.varlen import why_not_packed

# The contract's base: what a plain callable is assumed to support when it declares nothing.
BASE_DTYPES = frozenset({"float32", "bfloat16"})
BASE_HEAD_DIMS = frozenset({16, 32, 64, 128})
STRIDE_KINDS = ("contiguous", "unit_last", "any")
BACKWARD_CONFIG_PREFIX = "bwd_"     # configuration names that go to the backward callable
FP32_MATMULS = ("ieee", "tf32")


class UnsupportedCaseError(ValueError):
    """Raised by an implementation for an input outside its declared capabilities."""


def refuse(what: str, value, supported) -> None:
    """Raise the one-line refusal every kernel in this repo uses for undeclared inputs."""
    raise UnsupportedCaseError(f"{what}={value!r} is not supported (supported: {supported})")


@dataclasses.dataclass(frozen=True)
class Capabilities:
    dtypes: frozenset[str] = BASE_DTYPES
    head_dims: frozenset[int] | None = BASE_HEAD_DIMS   # None: any head dim up to max_head_dim
    max_head_dim: int = 256
    causal: tuple[str, ...] = ("top_left",)             # alignments accepted besides non-causal
    gqa: bool = False                                    # Hkv < Hq (Hq a multiple of Hkv)
    strides: str = "any"                                 # contiguous | unit_last | any
    zero_length: bool = False                            # Nq == 0 or Nk == 0
    returns_lse: bool = True
    backward: bool = False                               # judge my gradients (dq, dk, dv)
    fp32_matmul: str = "ieee"                            # ieee | tf32
    deterministic: bool = True                           # bitwise-identical reruns
    # Bitwise-identical gradients on reruns; a backward that accumulates dq with atomics
    # (FlashAttention's single-pass form) adds in scheduling order and declares False.
    deterministic_backward: bool = True
    out_buffer: bool = False                             # accepts out= / lse= to write into
    # -- attention variants (AttentionCase.window / .softcap): declared, the call gets them as
    # window=(left, right) and softcap=float keyword arguments; undeclared, never drawn.
    window: bool = False
    softcap: bool = False
    alibi: bool = False          # AttentionCase.alibi: the call gets alibi_slopes=(Hq,) float32
    # AttentionCase.paged_kv: the forward gets k_cache, v_cache for k, v and block_table= and
    # cache_seqlens= (None for a dense case); gradients, by autograd, reach k, v through them.
    paged_kv: bool = False
    # Packed ragged batches (fuzzattn/contract/varlen.py): declared, every call is the varlen one
    # and only packed cases are drawn; undeclared, packed cases are refused.
    varlen: bool = False
    # -- length constraints real kernels have (strategies draw inside them directly) ------------
    equal_lengths: bool = False                          # Nq == Nk only
    # Nq == Nk for causal cases only (FLASH through SDPA on CUDA raises for is_causal otherwise)
    causal_equal_lengths: bool = False
    min_seq_len: int = 1                                 # shortest Nq and Nk (0 needs zero_length)
    seq_multiple: int = 1                                # Nq and Nk multiples of this (a block size)
    # -- errors the implementation refuses with (e.g. SDPA's "No available kernel"): such draws
    # are counted and reported as refusals, never as passes, and never as crashes.
    refusals: tuple[str, ...] = ()
    # -- configuration space: named compile-time choices, each a tuple whose first entry is the
    # simplest (shrinking moves there). Drawn per case, recorded in it, passed as config=<dict>.
    # Names starting with BACKWARD_CONFIG_PREFIX ("bwd_") belong to the backward callable (passed
    # to it without the prefix); the forward gets the others. A case may omit all backward keys
    # (the backward then runs its own default), so cases written before a backward existed stay
    # valid.
    configs: tuple[tuple[str, tuple], ...] = ()
    # config_rule(config: dict, case) -> str | None: why a configuration cannot run this case
    # (e.g. a tile too large for the head dim), or None. Compared by identity, not value. It may
    # read the case's head_dim, dtype and causal (what resource limits depend on): strategies
    # enumerate the valid combinations once per such triple.
    config_rule: Callable[[dict, AttentionCase], str | None] | None = dataclasses.field(
        default=None, compare=False)
    # What runs a case that names no key of a pass (forward, or bwd_ backward): one point of the
    # space per pass, or () for the implementation's own default. Declared, it makes such a case
    # (a regression file written by hand, or before a configuration existed) run the same tiles
    # on every machine, where an own default may be an autotuner's pick that differs by device.
    default_config: tuple[tuple[str, object], ...] = ()
    # A configuration that fails to compile for a case with an error Triton's autotuner skips
    # (OutOfResources, CompileTimeAssertionFailure, PTXASError) is pruned for that case, as the
    # autotuner would skip it; only a case no configuration compiles for is a finding
    # (fuzzattn/run/pruning.py). False: every compile error is a crash.
    prune_compile_errors: bool = True
    # Upstream defects already pinned by regression files (fuzzattn.contract.known_defects):
    # campaigns pass over the cases they cover, as over a declared refusal.
    known_defects: tuple = ()
    # -- compiled per shape (torch.compile with static shapes, say): every new shape, stride
    # pattern and scale is a compile, so a palette campaign draws them from `palette_shapes`
    # fixed entries (fuzzattn.strategies.shape_palette) and varies the rest per case.
    compiles_per_shape: bool = False
    palette_shapes: int = 4
    # The dtypes in which a call builds a plan per new shape and caches it (SDPA's default
    # dispatch picks cuDNN for bf16/fp16 on CUDA: ~125 ms for a shape's first call, ~1 ms after,
    # benchmarks/sdpa_shapes.py). Their campaigns draw shapes from a shape palette as
    # compiles_per_shape does; nothing else changes (the calls are not torch.compile'd).
    plans_per_shape: frozenset = frozenset()

    def __post_init__(self):
        if isinstance(self.configs, dict):
            object.__setattr__(self, "configs", tuple((k, tuple(v)) for k, v in self.configs.items()))
        object.__setattr__(self, "refusals", tuple(self.refusals))
        object.__setattr__(self, "known_defects", tuple(self.known_defects))
        if isinstance(self.default_config, dict):
            object.__setattr__(self, "default_config", tuple(sorted(self.default_config.items())))
        declared = dict(self.configs)
        for name, value in self.default_config:
            if value not in declared.get(name, ()):
                raise ValueError(f"default_config[{name!r}]={value!r} is not a declared choice "
                                 f"({declared.get(name, 'no such axis')})")
        for name, choices in self.configs:
            if not choices:
                raise ValueError(f"configs[{name!r}] has no choices")
        if self.palette_shapes < 1:
            raise ValueError(f"palette_shapes={self.palette_shapes} must be >= 1")
        if self.min_seq_len < 0 or self.seq_multiple < 1:
            raise ValueError(f"min_seq_len={self.min_seq_len} must be >= 0 and seq_multiple="
                             f"{self.seq_multiple} >= 1")
        object.__setattr__(self, "dtypes", frozenset(self.dtypes))
        object.__setattr__(self, "plans_per_shape", frozenset(self.plans_per_shape))
        if self.head_dims is not None:
            object.__setattr__(self, "head_dims", frozenset(self.head_dims))
        object.__setattr__(self, "causal", tuple(self.causal))
        bad = sorted(set(self.dtypes) - set(DTYPES))
        if bad:
            raise ValueError(f"dtypes={bad[0]!r} is not one of {DTYPES}")
        bad = [a for a in self.causal if a not in CAUSAL_ALIGNMENTS]
        if bad:
            raise ValueError(f"causal={bad[0]!r} is not one of {CAUSAL_ALIGNMENTS}")
        if self.strides not in STRIDE_KINDS:
            raise ValueError(f"strides={self.strides!r} is not one of {STRIDE_KINDS}")
        if self.fp32_matmul not in FP32_MATMULS:
            raise ValueError(f"fp32_matmul={self.fp32_matmul!r} is not one of {FP32_MATMULS}")

    def per_shape(self, dtypes) -> bool:
        """Whether a campaign over `dtypes` meets a compile or a plan at every new shape (so a
        palette campaign draws whole shapes from a shape palette): compiles_per_shape, or a
        plan per shape in every one of `dtypes`."""
        return self.compiles_per_shape or (bool(self.plans_per_shape)
                                           and set(dtypes) <= self.plans_per_shape)

    def accepts_head_dim(self, d: int) -> bool:
        return d in self.head_dims if self.head_dims is not None else 1 <= d <= self.max_head_dim

    def accepts_layout(self, layout: str) -> bool:
        if self.strides == "any":
            return True
        if self.strides == "unit_last":
            return layout != "last_dim_strided"
        return layout == "contiguous"

    def why_not(self, case: AttentionCase) -> str | None:
        """The first reason this case is outside the declared capabilities, or None."""
        if case.dtype not in self.dtypes:
            return f"dtype={case.dtype}"
        if not self.accepts_head_dim(case.head_dim):
            return f"head_dim={case.head_dim}"
        if case.causal != "none" and case.causal not in self.causal:
            return f"causal={case.causal}"
        if case.causal != "none" and self.causal_equal_lengths and case.seq_q != case.seq_k:
            return f"causal={case.causal} with seq_q={case.seq_q} != seq_k={case.seq_k}"
        if case.kv_heads != case.heads and not self.gqa:
            return f"kv_heads={case.kv_heads} < heads={case.heads}"
        if case.windowed and not self.window:
            return f"window={case.window}"
        if case.softcap and not self.softcap:
            return f"softcap={case.softcap:g}"
        if case.alibi and not self.alibi:
            return f"alibi={case.alibi}"
        if case.paged_kv and not self.paged_kv:
            return f"paged_kv={case.paged_kv}"
        if case.varlen or self.varlen:
            why = why_not_packed(self, case)
            if why is not None:
                return why
        if not self.zero_length and (case.seq_q == 0 or case.seq_k == 0):
            return f"zero length (seq_q={case.seq_q}, seq_k={case.seq_k})"
        why = self.why_not_lengths(case.seq_q, case.seq_k)
        if why is not None:
            return why
        for tensor, layout in zip("qkv", case.layout):
            if not self.accepts_layout(layout):
                return f"layout[{tensor}]={layout}"
        return self.why_not_config(case)

    def pass_config(self, case: AttentionCase, backward: bool) -> dict:
        """The configuration one pass runs for this case, prefix removed for the backward: the
        case's keys of that pass, else default_config's, else {} (the implementation's own)."""
        prefix = BACKWARD_CONFIG_PREFIX

        def of_pass(items) -> dict:
            return {name[len(prefix):] if backward else name: value for name, value in items
                    if name.startswith(prefix) == backward}
        return of_pass(case.config) or of_pass(self.default_config)

    def why_not_lengths(self, seq_q: int, seq_k: int) -> str | None:
        """The declared length constraints (zero lengths aside), or None when both fit."""
        if self.equal_lengths and seq_q != seq_k:
            return f"seq_q={seq_q} != seq_k={seq_k} (equal lengths only)"
        for name, n in (("seq_q", seq_q), ("seq_k", seq_k)):
            if n == 0:
                continue
            if n < self.min_seq_len:
                return f"{name}={n} < min_seq_len={self.min_seq_len}"
            if n % self.seq_multiple:
                return f"{name}={n} not a multiple of {self.seq_multiple}"
        return None

    def why_not_config(self, case: AttentionCase) -> str | None:
        """Whether the case's configuration is one this implementation declares, and valid for
        the case by its rule. A case naming no configuration runs the implementation's default
        (an autotuner's choice, say): regression files written without one replay everywhere."""
        config = case.config_dict
        declared = dict(self.configs)
        if not config:
            return None       # no configuration named: the implementation's own default
        # The forward's axes and the backward's (bwd_ prefix) are named all or not at all, each
        # group apart: a group the case leaves out runs that pass's own default.
        backward_keys = {n for n in declared if n.startswith(BACKWARD_CONFIG_PREFIX)}
        for group in (backward_keys, set(declared) - backward_keys):
            if group and not group & set(config):
                declared = {n: c for n, c in declared.items() if n not in group}
        if set(config) != set(declared):
            if not declared:
                return f"config={config} (declares no configuration space)"
            return f"config keys {sorted(config)} (declares {sorted(declared)})"
        for name, value in config.items():
            if value not in declared[name]:
                return f"config {name}={value!r} (choices {declared[name]})"
        if declared and self.config_rule is not None:
            why = self.config_rule(config, case)
            if why:
                return f"config {case.config_dict}: {why}"
        return None

    def check_inputs(self, q, k, v, *, causal, scale) -> tuple[str, float]:
        """Refuse, in one line (UnsupportedCaseError), any tensors outside this declaration;
        return the call's (causal, scale) in the project's one encoding: causal is "none",
        "top_left" or "bottom_right" (a bare True means top-left, SDPA's and the article's
        alignment), scale a float. Kernels read their sizes from the tensors themselves."""
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                refuse(f"type({name})", type(t).__name__, "torch.Tensor")
            if t.dim() != 4:
                refuse(f"{name}.dim()", t.dim(), "4: (B, H, N, D)")
            if getattr(of_torch(t.dtype), "name", None) not in self.dtypes:
                refuse(f"{name}.dtype", str(t.dtype), sorted(self.dtypes))
        if not (k.dtype == v.dtype == q.dtype):
            refuse("dtypes (q, k, v)", (str(q.dtype), str(k.dtype), str(v.dtype)), "one shared dtype")
        if not (q.device == k.device == v.device):
            refuse("devices (q, k, v)", (str(q.device), str(k.device), str(v.device)), "one device")
        batch, heads, seq_q, head_dim = q.shape
        _, kv_heads, seq_k, _ = k.shape
        if k.shape != v.shape:
            refuse("v.shape", tuple(v.shape), f"k.shape {tuple(k.shape)}")
        if k.shape[0] != batch or k.shape[3] != head_dim:
            refuse("k.shape", tuple(k.shape), f"(B={batch}, Hkv, Nk, D={head_dim})")
        if batch == 0 or heads == 0:
            refuse("batch, heads", (batch, heads), "at least 1 each")
        if kv_heads == 0 or heads % kv_heads:
            refuse("kv_heads", kv_heads, f"a divisor of heads={heads}")
        if kv_heads != heads and not self.gqa:
            refuse("kv_heads", kv_heads, f"heads={heads} (no GQA)")
        if not self.accepts_head_dim(head_dim):
            refuse("head_dim", head_dim, sorted(self.head_dims) if self.head_dims is not None
                   else f"1..{self.max_head_dim}")
        if not self.zero_length and (seq_q == 0 or seq_k == 0):
            refuse("zero length (seq_q, seq_k)", (seq_q, seq_k), "seq_q >= 1 and seq_k >= 1")
        why = self.why_not_lengths(seq_q, seq_k)
        if why is not None:
            refuse("lengths (seq_q, seq_k)", (seq_q, seq_k), f"the declared constraints ({why})")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not self.accepts_strides(t):
                refuse(f"{name}.stride()", t.stride(), f"{self.strides} strides")
        if causal is True:
            causal = "top_left"
        elif causal is False or causal is None:
            causal = "none"
        elif not isinstance(causal, str) or causal not in self.causal:
            refuse("causal", causal, "False, True" + "".join(f", {a!r}" for a in self.causal))
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            refuse("scale", scale, "a finite float")
        return causal, float(scale)

    def check_variants(self, *, window, softcap) -> tuple[tuple[int, int], float]:
        """Refuse, in one line, a window or softcap this declaration does not take or that is
        malformed; return them as (left, right) ints and a float (0.0: off)."""
        if not isinstance(window, (tuple, list)) or len(window) != 2 or any(
                not isinstance(w, int) or isinstance(w, bool) or w < -1 for w in window):
            refuse("window", window, "(left, right), ints >= -1")
        window = (int(window[0]), int(window[1]))
        if window != (-1, -1) and not self.window:
            refuse("window", window, "(-1, -1): no sliding window")
        if (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                or not math.isfinite(softcap) or softcap < 0):
            refuse("softcap", softcap, "a finite float >= 0")
        if softcap and not self.softcap:
            refuse("softcap", softcap, "0.0: no softcap")
        return window, float(softcap)

    def check_alibi(self, alibi_slopes, q: torch.Tensor) -> torch.Tensor | None:
        """Refuse, in one line, slopes this declaration does not take or that are malformed
        (not a finite float32 (Hq,) tensor on q's device); return them, or None (off)."""
        if alibi_slopes is None:
            return None
        if not self.alibi:
            refuse("alibi_slopes", "a tensor", "None: no ALiBi")
        if (not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32
                or tuple(alibi_slopes.shape) != (q.shape[1],)
                or alibi_slopes.device != q.device or not bool(alibi_slopes.isfinite().all())):
            shown = (tuple(alibi_slopes.shape), alibi_slopes.dtype) if isinstance(
                alibi_slopes, torch.Tensor) else alibi_slopes
            refuse("alibi_slopes", shown, f"a finite float32 ({q.shape[1]},) tensor on {q.device}")
        return alibi_slopes

    def check_paged(self, k_cache, v_cache, block_table, cache_seqlens, q) -> int:
        """Refuse, in one line, a paged cache this declaration does not take or that is malformed
        (contract/paged.py's form, one length for every sequence); return that length."""
        if not self.paged_kv:
            refuse("block_table", "a tensor", "None: no paged KV cache")
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if t.dim() != 4 or t.shape != k_cache.shape or t.shape[-1] != q.shape[-1]:
                refuse(f"{name}.shape", tuple(t.shape), "(num_blocks, block_size, Hkv, D)")
        for name, t, rank in (("block_table", block_table, 2), ("cache_seqlens", cache_seqlens, 1)):
            if (not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != rank
                    or t.shape[0] != q.shape[0]):
                shown = (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t
                refuse(name, shown, f"an int32 tensor of {rank} dims, {q.shape[0]} rows")
        inside = (block_table >= 0) & (block_table < k_cache.shape[0])
        if not bool(inside.all()):
            refuse("block_table", "an entry", f"physical blocks 0..{k_cache.shape[0] - 1}")
        lengths = set(cache_seqlens.tolist())
        if len(lengths) > 1 or not 0 <= min(lengths) <= block_table.shape[1] * k_cache.shape[1]:
            refuse("cache_seqlens", sorted(lengths),
                   "one length for every sequence, within its blocks")
        return lengths.pop()

    def accepts_strides(self, t: torch.Tensor) -> bool:
        """Whether a tensor's memory layout is inside `strides` (stride-0 broadcasts count as any)."""
        if self.strides == "any":
            return True
        if self.strides == "unit_last":
            return t.shape[-1] <= 1 or t.stride(-1) == 1
        return t.is_contiguous()
