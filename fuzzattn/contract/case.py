"""AttentionCase: a small, printable, hashable description of one attention problem.

A case holds sizes, flags, an implementation configuration and a data seed, never tensors:
`fuzzattn.inputs.materialize.materialize` turns it into bit-identical tensors on any machine.
Hypothesis draws cases, so shrinking acts on shapes.

Two seeds exist in fuzzattn and they have two names everywhere: `data_seed` (this field: the CPU
generator seed the tensors' values come from) and the *Hypothesis seed* (which cases a campaign
draws: `--hypothesis-seed`). Files written before the rename call the data seed `seed`; they
still load.

Causal masking has one encoding along the whole walk: "none", "top_left" or "bottom_right".
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

from fuzzattn.contract.alibi import FAMILIES as ALIBI_FAMILIES
from fuzzattn.contract.dtypes import BY_NAME, DTYPES
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
CAUSAL_MODES = ("none",) + CAUSAL_ALIGNMENTS

# How each of q, k, v sits in memory. Ordered simple -> exotic so that shrinking moves left.
#   contiguous       (B, H, N, D) row-major, NaN guard storage before and after it
#   transposed       stored (B, N, H, D) and viewed as (B, H, N, D): FlashAttention's native layout
#   sliced           every other row of a larger NaN-filled storage, with a storage offset and NaN
#                    columns past D: padding past every sequence end and every row
#   broadcast_batch  k/v only: one batch element expanded with stride 0 over the batch
#   broadcast_heads  k/v only: one head expanded with stride 0 over the heads
#   last_dim_strided last dimension has stride 2 (NaN in between): only for kernels declaring it
LAYOUTS = ("contiguous", "transposed", "sliced", "broadcast_batch", "broadcast_heads",
           "last_dim_strided")
KV_ONLY_LAYOUTS = ("broadcast_batch", "broadcast_heads")

# Value profiles, ordered simple -> exotic so that shrinking moves toward "normal".
#   normal          standard normal q, k, v
#   large           q and k scaled so scores reach ~1e4: far beyond exp's range without a max
#   near_constant   all keys nearly equal: every row's softmax is almost uniform
#   dominant_key    one key per (batch, head) aligned with every query: softmax almost one-hot
#   zero_query_rows some query rows are exactly zero: uniform weights over visible keys
#   below_sentinel  every score far below -1e6: a finite mask sentinel then out-votes real keys
#   sentinel_sweep  every score past minus one of a sweep of magnitudes (10 to half fp32's
#                   lowest), by at most 2x: a finite mask sentinel that size or less out-votes them
#   exact_mean      q = 0 and v constant along the keys: every output exact, so a running state
#                   rounded to the input dtype errs where the reference does not
#                   (the last two: fuzzattn/inputs/sources.py)
VALUE_PROFILES = ("normal", "large", "near_constant", "dominant_key", "zero_query_rows",
                  "below_sentinel", "sentinel_sweep", "exact_mean")

# Where the case's values come from (fuzzattn/inputs/sources.py): the CPU torch.Generator, or a
# counter-based generator giving the same bits on any device, so inputs can be born there.
GENERATORS = ("torch_cpu", "counter")

# Sane ranges, checked before anything is allocated: a value outside them is a typo or an
# attack on the harness, never a case worth running. Sizes are also checked against a memory
# budget by the engine (fuzzattn.inputs.budget.check_budget) before materialising.
MAX_SIZE = {"batch": 4096, "heads": 4096, "kv_heads": 4096, "seq_q": 1 << 20, "seq_k": 1 << 20,
            "head_dim": 4096}
MAX_DATA_SEED = 2**63 - 1       # torch.Generator.manual_seed takes 64-bit seeds
MAX_ABS_SCALE = 1024.0          # 1/sqrt(D) is <= 1; a scale past 1e3 saturates every softmax
# A softcap bounds every score to (-cap, cap); caps in use are tens (Gemma 2 uses 50), and one
# past every value profile's scores (~1e4) bends nothing: a typo, not a case.
MAX_SOFTCAP = 1e4
NO_WINDOW = (-1, -1)
MAX_SEQUENCES = 4096            # sequences in one packed case (AttentionCase.seqlens_q)


class CaseError(ValueError):
    """A case description that names an impossible or unknown value."""


@dataclasses.dataclass(frozen=True)
class AttentionCase:
    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    dtype: str = "float32"
    causal: str = "none"
    scale: float | None = None          # None: the usual 1/sqrt(head_dim)
    layout: tuple[str, str, str] = ("contiguous", "contiguous", "contiguous")  # q, k, v
    values: str = "normal"
    data_seed: int = 0
    # The implementation's compile-time choices (tile sizes, warps, a mask form ...), as sorted
    # (name, value) pairs: drawn from its declared configuration space, recorded and replayed
    # like the sizes. Empty for implementations that declare none.
    config: tuple[tuple[str, Any], ...] = ()
    # fuzzattn/inputs/sources.py: "torch_cpu" for every case saved before the field existed.
    generator: str = "torch_cpu"
    # Sliding window (left, right), FlashAttention's: query i sees key j iff
    # i + Nk - Nq - left <= j <= i + Nk - Nq + right (bottom-right aligned), -1 unbounded on its
    # side; intersected with the causal mask when causal is set.
    window: tuple[int, int] = NO_WINDOW
    # Scores become softcap * tanh(scale * q.k / softcap) before any mask; 0.0: off.
    softcap: float = 0.0
    # ALiBi: a slope family's name (contract/alibi.py), "" off; -slope_h * |i + Nk - Nq - j| is
    # added to each scaled, softcapped score before the mask.
    alibi: str = ""
    # A paged KV cache's block size (contract/paged.py lays k, v out in shuffled blocks); 0: the
    # dense k, v.
    paged_kv: int = 0
    # Packed ragged batch (fuzzattn/contract/varlen.py): the sequences' lengths, q's and k's, in
    # packing order; () for a dense case. A packed case has batch 1 and seq_q, seq_k the totals.
    seqlens_q: tuple[int, ...] = ()
    seqlens_k: tuple[int, ...] = ()

    def __post_init__(self):
        if isinstance(self.layout, list):
            object.__setattr__(self, "layout", tuple(self.layout))
        if isinstance(self.window, list):
            object.__setattr__(self, "window", tuple(self.window))
        for name in ("seqlens_q", "seqlens_k"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if (not isinstance(self.window, tuple) or len(self.window) != 2
                or any(not isinstance(w, int) or isinstance(w, bool) or w < -1
                       or w > MAX_SIZE["seq_k"] for w in self.window)):
            raise CaseError(f"window={self.window!r} must be (left, right), each an int in "
                            f"-1..{MAX_SIZE['seq_k']} (-1: unbounded)")
        if (isinstance(self.softcap, bool) or not isinstance(self.softcap, (int, float))
                or not math.isfinite(self.softcap) or not 0 <= self.softcap <= MAX_SOFTCAP):
            raise CaseError(f"softcap={self.softcap!r} must be a number in [0, {MAX_SOFTCAP:g}] "
                            "(0: off)")
        if isinstance(self.softcap, int):
            object.__setattr__(self, "softcap", float(self.softcap))
        if not isinstance(self.alibi, str) or self.alibi not in ("", *ALIBI_FAMILIES):
            raise CaseError(f"alibi={self.alibi!r} must be one of {', '.join(ALIBI_FAMILIES)} "
                            "or '' (off)")
        if (not isinstance(self.paged_kv, int) or isinstance(self.paged_kv, bool)
                or not 0 <= self.paged_kv <= MAX_SIZE["seq_k"]):
            raise CaseError(f"paged_kv={self.paged_kv!r} must be a block size, an int in "
                            f"0..{MAX_SIZE['seq_k']} (0: dense k, v)")
        if isinstance(self.config, dict):
            object.__setattr__(self, "config", tuple(sorted(self.config.items())))
        elif isinstance(self.config, list):
            object.__setattr__(self, "config", tuple(sorted(tuple(p) for p in self.config)))
        for name in ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "data_seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise CaseError(f"{name}={value!r} must be a non-negative int")
            limit = MAX_SIZE.get(name, MAX_DATA_SEED)
            if value > limit:
                raise CaseError(f"{name}={value!r} is beyond the sane range 0..{limit}")
        for name in ("batch", "heads", "kv_heads", "head_dim"):
            if getattr(self, name) == 0:
                raise CaseError(f"{name}=0 must be at least 1")
        if self.seqlens_q or self.seqlens_k:
            self._check_seqlens()
        if self.heads % self.kv_heads:
            raise CaseError(f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if self.dtype not in DTYPES:
            raise CaseError(f"dtype={self.dtype!r} is not one of {DTYPES}")
        if self.causal not in CAUSAL_MODES:
            raise CaseError(f"causal={self.causal!r} is not one of {CAUSAL_MODES}")
        if self.scale is not None and (not isinstance(self.scale, (int, float))
                                       or isinstance(self.scale, bool)
                                       or not math.isfinite(self.scale)
                                       or abs(self.scale) > MAX_ABS_SCALE):
            raise CaseError(f"scale={self.scale!r} must be a number in "
                            f"[-{MAX_ABS_SCALE:g}, {MAX_ABS_SCALE:g}] or None")
        if len(self.layout) != 3:
            raise CaseError(f"layout={self.layout!r} needs one entry for each of q, k, v")
        for tensor, layout in zip("qkv", self.layout):
            if layout not in LAYOUTS:
                raise CaseError(f"layout[{tensor}]={layout!r} is not one of {LAYOUTS}")
            if tensor == "q" and layout in KV_ONLY_LAYOUTS:
                raise CaseError(f"layout[q]={layout!r} only applies to k and v")
        if self.generator not in GENERATORS:
            raise CaseError(f"generator={self.generator!r} is not one of {GENERATORS}")
        if self.values not in VALUE_PROFILES:
            raise CaseError(f"values={self.values!r} is not one of {VALUE_PROFILES}")
        for pair in self.config:
            if (not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], str)
                    or not isinstance(pair[1], (int, str, bool))):
                raise CaseError(f"config entry {pair!r} must be a name and an int, str or bool")

    def _check_seqlens(self) -> None:
        """Raise CaseError, naming the bad value, for lengths no packed batch can have."""
        for name in ("seqlens_q", "seqlens_k"):
            lengths = getattr(self, name)
            if (not isinstance(lengths, tuple) or not 1 <= len(lengths) <= MAX_SEQUENCES
                    or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in lengths)):
                raise CaseError(f"{name}={lengths!r} must be 1..{MAX_SEQUENCES} non-negative ints")
        if len(self.seqlens_q) != len(self.seqlens_k):
            raise CaseError(f"seqlens_q={self.seqlens_q!r} and seqlens_k={self.seqlens_k!r} "
                            "must name the same number of sequences")
        if self.batch != 1:
            raise CaseError(f"batch={self.batch} must be 1 for a packed case (the sequences are "
                            "seqlens_q / seqlens_k)")
        for name, total, lengths in (("seq_q", self.seq_q, self.seqlens_q),
                                     ("seq_k", self.seq_k, self.seqlens_k)):
            if total != sum(lengths) or total > MAX_SIZE[name]:
                raise CaseError(f"{name}={total} must be the total of the packed lengths, "
                                f"{sum(lengths)}, at most {MAX_SIZE[name]}")
        # ALiBi's distance and a paged cache's block table are defined per dense batch row; a
        # packed batch would need them per sequence, which no implementation here declares.
        if self.alibi or self.paged_kv:
            raise CaseError(f"alibi={self.alibi!r}, paged_kv={self.paged_kv} cannot be combined "
                            "with a packed case (seqlens_q / seqlens_k)")

    # -- derived facts ------------------------------------------------------------------------
    @property
    def softmax_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim) if self.scale is None else float(self.scale)

    @property
    def is_causal(self) -> bool:
        return self.causal != "none"

    @property
    def windowed(self) -> bool:
        return self.window != NO_WINDOW

    @property
    def varlen(self) -> bool:
        """Whether this is a packed ragged batch (seqlens_q / seqlens_k set)."""
        return bool(self.seqlens_q)

    @property
    def variants(self) -> tuple[str, ...]:
        """The attention variants this case uses ("window", "softcap", "alibi", "paged_kv",
        "varlen"): () for plain attention."""
        return ((("window",) if self.windowed else ()) + (("softcap",) if self.softcap else ())
                + (("alibi",) if self.alibi else ()) + (("paged_kv",) if self.paged_kv else ())
                + (("varlen",) if self.varlen else ()))

    @property
    def macs(self) -> int:
        """B * Hq * Nq * max(Nk, 1) * D: the multiply-adds of one attention matmul, the size by
        which a case is judged on the host or the device, and given its generator."""
        return self.batch * self.heads * self.seq_q * max(self.seq_k, 1) * self.head_dim

    @property
    def group_size(self) -> int:
        """Query heads per kv head: 1 for MHA, heads for MQA."""
        return self.heads // self.kv_heads

    def shape(self, tensor: str) -> tuple[int, int, int, int]:
        if tensor == "q":
            return (self.batch, self.heads, self.seq_q, self.head_dim)
        return (self.batch, self.kv_heads, self.seq_k, self.head_dim)

    @property
    def config_dict(self) -> dict[str, Any]:
        return dict(self.config)

    def replace(self, **changes) -> "AttentionCase":
        return dataclasses.replace(self, **changes)

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        # Every field's value as it is: they are immutable (ints, strs, a float, tuples of them),
        # so dataclasses.asdict's recursive copy (~40 us, a case's key every judged case) would
        # build the same dict.
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["layout"] = list(self.layout)
        if self.config:
            d["config"] = dict(self.config)
        else:
            del d["config"]       # configless cases keep the same key and file as before configs
        if self.generator == "torch_cpu":
            del d["generator"]    # so do cases of the CPU generator, as before the field existed
        if self.windowed:
            d["window"] = list(self.window)
        else:
            del d["window"]       # plain cases keep their key and file, as before the variants
        if not self.softcap:
            del d["softcap"]
        if not self.alibi:
            del d["alibi"]
        if not self.paged_kv:
            del d["paged_kv"]
        for name in ("seqlens_q", "seqlens_k"):
            if getattr(self, name):
                d[name] = list(getattr(self, name))
            else:
                del d[name]       # dense cases keep their key and file
        return d

    @classmethod
    def from_dict(cls, data: Any) -> "AttentionCase":
        """Build a case from parsed JSON; errors name the offending field."""
        if not isinstance(data, dict):
            raise CaseError(f"case must be an object, got {type(data).__name__}")
        if "seed" in data and "data_seed" not in data:      # files written before the rename
            data = {("data_seed" if k == "seed" else k): v for k, v in data.items()}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise CaseError(f"case.{unknown[0]} is not a known field (known: {', '.join(fields)})")
        required = [n for n, f in fields.items() if f.default is dataclasses.MISSING]
        missing = [n for n in required if n not in data]
        if missing:
            raise CaseError(f"case.{missing[0]} is missing")
        expected = {"batch": int, "heads": int, "kv_heads": int, "seq_q": int, "seq_k": int,
                    "head_dim": int, "data_seed": int, "dtype": str, "causal": str, "values": str,
                    "layout": list, "config": dict, "generator": str, "window": list,
                    "alibi": str, "paged_kv": int, "seqlens_q": list, "seqlens_k": list}
        for name, kind in expected.items():
            if name in data and (not isinstance(data[name], kind) or isinstance(data[name], bool)):
                raise CaseError(f"case.{name}={data[name]!r} should be of type {kind.__name__}")
        return cls(**data)

    def key(self) -> str:
        """Short stable hash: names fixtures and deduplicates them. Computed once per case (the
        case is frozen; a campaign asks for it several times per judged case)."""
        cached = self.__dict__.get("_key")
        if cached is None:
            blob = json.dumps(self.to_dict(), sort_keys=True).encode()
            cached = hashlib.sha256(blob).hexdigest()[:12]
            object.__setattr__(self, "_key", cached)
        return cached

    def __repr__(self) -> str:
        """The constructor call, with the fields left at their defaults left out: what a
        failure report and Hypothesis's falsifying example print, on one line."""
        shown = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.default is dataclasses.MISSING or value != field.default:
                shown.append(f"{field.name}={value!r}")
        return f"AttentionCase({', '.join(shown)})"

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(repr(self))    # Hypothesis's printer: one line, not one field a line

    def __str__(self) -> str:
        heads = f"H={self.heads}" if self.kv_heads == self.heads else f"H={self.heads}/{self.kv_heads}"
        scale = "" if self.scale is None else f" scale={self.scale:g}"
        layout = "" if set(self.layout) == {"contiguous"} else " layout=" + ",".join(
            f"{t}:{l}" for t, l in zip("qkv", self.layout) if l != "contiguous")
        causal = "" if self.causal == "none" else f" causal={self.causal}"
        values = "" if self.values == "normal" else f" values={self.values}"
        config = "" if not self.config else " config=" + ",".join(f"{k}:{v}" for k, v in self.config)
        generator = "" if self.generator == "torch_cpu" else f" generator={self.generator}"
        window = "" if not self.windowed else f" window={self.window[0]},{self.window[1]}"
        softcap = "" if not self.softcap else f" softcap={self.softcap:g}"
        alibi = "" if not self.alibi else f" alibi={self.alibi}"
        paged = "" if not self.paged_kv else f" paged_kv={self.paged_kv}"
        varlen = "" if not self.varlen else (" seqlens=" + ",".join(
            f"{a}/{b}" for a, b in zip(self.seqlens_q, self.seqlens_k)))
        return (f"B={self.batch} {heads} Nq={self.seq_q} Nk={self.seq_k} D={self.head_dim} "
                f"{BY_NAME[self.dtype].short}{causal}{window}{softcap}{alibi}{paged}{varlen}{scale}"
                f"{layout}{values}"
                f"{config} data_seed={self.data_seed}{generator}")
