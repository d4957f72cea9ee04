"""attention_cases: whole AttentionCases drawn within what an implementation declares."""
from __future__ import annotations

import itertools

from hypothesis import event, strategies as st
from hypothesis.errors import InvalidArgument

from fuzzattn.contract.case import DTYPES, AttentionCase
from fuzzattn.contract import Capabilities
from fuzzattn.contract.profiles import Profile, active

from .configs import configs, constrained_length
from .layouts import layout_choices, layouts
from .lengths import head_dim_choices, head_dims, seq_lens, seq_shapes
from .palette import head_dim_subset, in_turn, subset
from .shape_palette import entries as palette_entries, palette_size
from .values import value_profiles
from .variants import alibis, page_sizes, softcaps, windows
from .packed import SEQUENCES_PER_BATCH, on_first_sequence, packed_lengths, packed_profile

# Softmax scales other than the default 1/sqrt(D) (None), drawn in half the cases.
OTHER_SCALES = (1.0, 0.5, 0.125, 2.0, 0.3)
# Value profiles that put scores past a mask sentinel: a softcap would pull them back to
# (-cap, cap), so they are drawn uncapped (a finite-sentinel bug stays findable in a kernel
# declaring softcaps).
UNCAPPED_VALUES = ("below_sentinel", "sentinel_sweep")
# exact_mean's premise is that every visible key weighs exactly 1 (q = 0), which makes a correct
# kernel exact; an ALiBi bias weighs keys by distance, inexactly, so those cases are drawn
# without one (seen: torch_tiled's bf16 dq 1.2x its allowance, the reference exact).
UNBIASED_VALUES = ("exact_mean",)


def attention_cases(caps: Capabilities = Capabilities(), *, dtype: str | None = None,
                    profile: Profile | None = None, palette: int | None = None,
                    shapes: int | None = None) -> st.SearchStrategy[AttentionCase]:
    """Cases inside `caps`, sized by `profile` (default: the active one); `dtype` pins one.

    `palette`: draw the layouts, head dims, configuration and variant combinations, which
    multiply a compiled kernel's variants, from a small subset numbered `palette` (see
    fuzzattn.strategies.palette), so that a campaign's compiled variants repeat; None draws from
    everything declared. For a declaration
    that `compiles_per_shape`, or builds `plans_per_shape` in every drawn dtype, the palette
    fixes shapes, scales and layouts too: `shapes` entries
    (default: fuzzattn.strategies.shape_palette.palette_size) of that module."""
    if dtype is not None and dtype not in caps.dtypes:
        raise InvalidArgument(f"dtype={dtype!r} is not among the declared dtypes {sorted(caps.dtypes)}")
    profile = profile or active()
    dtypes = [dtype] if dtype is not None else [d for d in DTYPES if d in caps.dtypes]
    if palette is None or not caps.per_shape(dtypes):
        shapes = None
    elif shapes is None:
        shapes = palette_size(caps)
    elif shapes < 1:
        raise InvalidArgument(f"shapes={shapes} must be at least 1")
    return _cases(caps, tuple(dtypes), profile, palette, shapes)


class _Parts:
    """The sub-strategies of one (declaration, dtypes, profile), built once: a strategy object
    built inside the composite on every draw costs more than drawing from it."""

    def __init__(self, caps: Capabilities, dtypes: tuple[str, ...], profile: Profile,
                 palette: int | None, shapes: int | None):
        self.caps = caps                  # kept alive: the cache below is keyed by its id
        self.palette = palette
        self.dtype = st.sampled_from(dtypes)
        self.batch = st.integers(1, profile.max_batch)
        self.kv_heads = st.integers(1, profile.max_kv_heads)
        self.group = st.integers(1, profile.max_group) if caps.gqa else st.just(1)
        self.shape = _shapes(caps, profile)
        self.causal = {family: st.sampled_from(_causal_choices(caps, family))
                       for family in ("decode", "square", "chunk", "tall", None)}
        self.scale = st.one_of(st.none(), st.sampled_from(OTHER_SCALES))
        # A palette draws one group of head dims, one set of binaries (palette.head_dim_subset):
        # the dims it leaves out come with the campaign's later palettes.
        self.head_dim = head_dims(caps.head_dims, max_head_dim=caps.max_head_dim)
        if palette is not None:
            self.head_dim = st.sampled_from(head_dim_subset(
                head_dim_choices(caps.head_dims, max_head_dim=caps.max_head_dim), palette))
        if palette is None:
            self.layout = layouts(caps)
        else:
            self.layout = st.sampled_from(subset(layout_choices(caps), palette, "layout"))
        self.values = {dtype: value_profiles(dtype) for dtype in dtypes}
        self.data_seed = st.integers(0, 2**31 - 1)
        self.softcap = softcaps() if caps.softcap else None
        self.alibi = alibis() if caps.alibi else None
        self.paged_kv = page_sizes() if caps.paged_kv else None
        # A palette draws the variants from few combinations: each one's flags are constexprs of
        # a compiled kernel, so every combination is another set of binaries (palette.py).
        self.variants = None if palette is None else st.sampled_from(
            in_turn(variant_combinations(caps), palette))
        # A declaration of varlen gets packed cases only (fuzzattn/contract/varlen.py).
        self.packed = None if not caps.varlen else packed_lengths(
            _shapes(caps, packed_profile(profile)),
            max_sequences=SEQUENCES_PER_BATCH * profile.max_batch, allow_zero=caps.zero_length)
        # A kernel compiled per shape: whole shapes (with scale and layout) from a few entries.
        self.entry = None if shapes is None else st.sampled_from(
            palette_entries(caps, profile, palette, shapes))


# The variants whose flags a compiled kernel may take as constexprs, in the order a palette's
# combinations list them.
VARIANT_AXES = ("window", "softcap", "alibi", "paged_kv")


def variant_combinations(caps: Capabilities) -> list[tuple[str, ...]]:
    """Every combination of the variants `caps` declares, none first (what shrinking moves
    toward), then by size."""
    declared = [name for name in VARIANT_AXES if getattr(caps, name)]
    return [combo for size in range(len(declared) + 1)
            for combo in itertools.combinations(declared, size)]


_PARTS: dict = {}


def _parts(caps: Capabilities, dtypes: tuple[str, ...], profile: Profile,
           palette: int | None, shapes: int | None) -> _Parts:
    key = (id(caps), dtypes, profile, palette, shapes)
    if key not in _PARTS:
        _PARTS[key] = _Parts(caps, dtypes, profile, palette, shapes)
    return _PARTS[key]


@st.composite
def _cases(draw, caps: Capabilities, dtypes: tuple[str, ...], profile: Profile,
           palette: int | None = None, shapes: int | None = None) -> AttentionCase:
    parts = _parts(caps, dtypes, profile, palette, shapes)
    dtype = draw(parts.dtype)
    if parts.entry is not None:
        e = draw(parts.entry)
        head_dim, batch, kv_heads, group = e.head_dim, e.batch, e.kv_heads, e.group
        family, seq_q, seq_k, scale, layout = e.family, e.seq_q, e.seq_k, e.scale, e.layout
    else:
        head_dim = draw(parts.head_dim)
        batch = draw(parts.batch)
        kv_heads = draw(parts.kv_heads)
        group = draw(parts.group)
        family, seq_q, seq_k = draw(parts.shape)
    seqlens_q = seqlens_k = ()
    if parts.packed is not None:
        seqlens_q, seqlens_k = draw(parts.packed)
        family, batch, seq_q, seq_k = "packed", 1, sum(seqlens_q), sum(seqlens_k)
    event(f"shape family={family}")
    causal = draw(parts.causal.get(family, parts.causal[None]))
    if causal != "none" and caps.causal_equal_lengths and not seqlens_q:
        seq_k = seq_q                      # the shape's Nq keeps every length constraint
    if parts.entry is None:
        scale = draw(parts.scale)
        layout = draw(parts.layout)
    values = draw(parts.values[dtype])
    data_seed = draw(parts.data_seed)
    case = AttentionCase(batch=batch, heads=kv_heads * group, kv_heads=kv_heads, seq_q=seq_q,
                         seq_k=seq_k, head_dim=head_dim, dtype=dtype, causal=causal, scale=scale,
                         layout=layout, values=values, data_seed=data_seed,
                         seqlens_q=seqlens_q, seqlens_k=seqlens_k)
    used = VARIANT_AXES if parts.variants is None else draw(parts.variants)
    if caps.window and "window" in used:   # a packed case's: drawn to its longest sequence
        case = case.replace(window=draw(windows(max(seqlens_q, default=seq_q),
                                                max(seqlens_k, default=seq_k))))
    if parts.softcap is not None and values not in UNCAPPED_VALUES and "softcap" in used:
        case = case.replace(softcap=draw(parts.softcap))
    if (parts.alibi is not None and values not in UNBIASED_VALUES and not case.varlen
            and "alibi" in used):
        case = case.replace(alibi=draw(parts.alibi))
    if parts.paged_kv is not None and not case.varlen and "paged_kv" in used:
        case = case.replace(paged_kv=draw(parts.paged_kv))
    case = case.replace(config=draw(configs(caps, case, parts.palette)),
                        generator=_generator(profile, case))
    _label(case)
    return case


def _generator(profile: Profile, case: AttentionCase) -> str:
    """The case's value source, decided by its size (profiles.Profile.device_values_macs), not
    drawn: shrinking a size past the bound changes the values, as any size change does."""
    bound = profile.device_values_macs
    return "counter" if bound is not None and case.macs > bound else "torch_cpu"


def _shapes(caps: Capabilities, profile: Profile) -> st.SearchStrategy[tuple[str, int, int]]:
    """(family, Nq, Nk): the shape families of fuzzattn.strategies.lengths, or for a kernel that constrains
    lengths (equal, a minimum, a multiple) independent draws inside its constraints."""
    if not (caps.equal_lengths or caps.seq_multiple > 1 or caps.min_seq_len > 1):
        return seq_shapes(max_len=profile.max_seq, max_large_len=profile.max_large_seq,
                          allow_zero=caps.zero_length)
    lengths = constrained_length(caps, seq_lens(max_len=profile.max_seq,
                                                max_large_len=profile.max_large_seq,
                                                allow_zero=caps.zero_length), profile.max_seq)
    if caps.equal_lengths:
        return lengths.map(lambda n: ("constrained", n, n))
    return st.tuples(st.just("constrained"), lengths, lengths)


def _causal_choices(caps: Capabilities, family: str) -> tuple[str, ...]:
    """Decode and chunked prefill are where the causal alignment decides which keys a query sees
    (top-left lets a lone decode query see key 0 only), and square shapes are causal prefill,
    where every query tile has a diagonal block: draw them causal, in each declared alignment
    (a loop bound off by a tile shows on those blocks: a dQ loop bounded by BLOCK_N survived 100
    dev cases while square shapes were left to a coin). The tall family is there for the empty-row convention, which only bottom-right
    alignment produces, so it is drawn bottom-right whenever that is declared (left to a coin,
    a short campaign may draw no Nq > Nk >= 1 bottom-right case at all). Non-causal versions of
    these shapes still come from the independent, multi_block and tile_edges families."""
    if not caps.causal or family not in ("decode", "square", "chunk", "tall"):
        return ("none",) + caps.causal
    if family == "tall" and "bottom_right" in caps.causal:
        return ("bottom_right",)
    return caps.causal


def _label(case: AttentionCase) -> None:
    """event() labels for --hypothesis-show-statistics: how often each input class is drawn."""
    event(f"dtype={case.dtype}")
    event(f"causal={case.causal}")
    if case.causal != "none":
        event("causal Nq<Nk" if case.seq_q < case.seq_k else
              "causal Nq>Nk" if case.seq_q > case.seq_k else "causal Nq=Nk")
    if case.causal == "bottom_right" and case.seq_q > case.seq_k:
        event("rows with no visible key")
    for axis, n in (("Nq", case.seq_q), ("Nk", case.seq_k)):
        if n == 0:
            event(f"{axis}=0")
        elif n % 16 == 0:
            event(f"{axis} multiple of tile")
        else:
            event(f"{axis} ragged tail")
    event("head_dim power of two" if case.head_dim & (case.head_dim - 1) == 0 else "head_dim odd")
    if case.kv_heads != case.heads:
        event("MQA" if case.kv_heads == 1 else "GQA")
    if case.scale is not None:
        event("non-default scale")
    for layout in sorted(set(case.layout)):
        event(f"layout {layout}")
    event(f"values={case.values}")
    for name, value in case.config:
        event(f"config {name}={value}")
    if case.windowed:
        event("window")
    if case.softcap:
        event("softcap")
    if case.alibi:
        event("alibi")
    if case.paged_kv:
        event("paged_kv")
    if case.varlen:
        event(f"varlen sequences={len(case.seqlens_q)}")
        if 0 in case.seqlens_q + case.seqlens_k:
            event("varlen sequence of length 0")


# -- cases outside a declaration: the refusal property ------------------------------------------
def _strides_show_layout(case: AttentionCase) -> bool:
    """Whether q's strides in `case` show its layout: an implementation sees strides, not layout
    names, and torch ignores the stride of a size-1 dimension (its own contiguity rule), so with
    D = 1 `last_dim_strided` is unit-last, and with H = 1 or Nq = 1 `transposed` is contiguous:
    an input no kernel can tell apart from a declared one is no refusal case."""
    layout = case.layout[0]
    if layout == "last_dim_strided":
        return case.head_dim > 1
    if layout == "transposed":
        return case.heads > 1 and case.seq_q > 1
    return True


def undeclared_cases(caps: Capabilities, *, profile: Profile | None = None
                     ) -> st.SearchStrategy[tuple[str, AttentionCase]]:
    """(what, case): a declared case with exactly one property moved outside the declaration.

    Raises InvalidArgument when the capabilities leave nothing undeclared to draw."""
    profile = profile or active()
    # what -> a function from a declared case to a strategy of undeclared variants of it
    edits: dict[str, object] = {}
    other_dtypes = sorted(set(DTYPES) - set(caps.dtypes))
    if other_dtypes:
        edits["dtype"] = lambda c: st.sampled_from(other_dtypes).map(lambda x: c.replace(dtype=x))
    if caps.head_dims is not None:
        bad_dims = [d for d in (8, 24, 40, 80, 96, 256, 3) if d not in caps.head_dims]
        edits["head_dim"] = lambda c: st.sampled_from(bad_dims).map(lambda x: c.replace(head_dim=x))
    else:
        edits["head_dim"] = lambda c: st.just(c.replace(head_dim=caps.max_head_dim + 8))
    missing_align = [a for a in ("top_left", "bottom_right") if a not in caps.causal]
    if missing_align:
        edits["causal"] = lambda c: st.sampled_from(missing_align).map(lambda x: c.replace(causal=x))
    if not caps.gqa:
        edits["gqa"] = lambda c: st.just(c.replace(heads=2 * c.kv_heads))
    if not caps.zero_length:
        edits["zero length"] = lambda c: st.sampled_from(("seq_q", "seq_k")).map(
            lambda f: c.replace(**{f: 0}))
    if caps.strides != "any":
        bad_layout = "last_dim_strided" if caps.strides == "unit_last" else "transposed"
        edits["layout"] = lambda c: st.just(
            c.replace(layout=(bad_layout,) + c.layout[1:])).filter(_strides_show_layout)
    # Just outside the length constraints: one key more, one below the minimum, one past a multiple.
    if caps.equal_lengths:
        edits["equal lengths"] = lambda c: st.just(c.replace(seq_k=c.seq_q + 1))
    if caps.causal_equal_lengths and caps.causal:
        edits["causal lengths"] = lambda c: st.just(c.replace(causal=caps.causal[0],
                                                              seq_k=c.seq_q + 1))
    if caps.min_seq_len > 1:
        edits["min length"] = lambda c: st.just(c.replace(seq_q=caps.min_seq_len - 1))
    if caps.seq_multiple > 1:
        edits["length multiple"] = lambda c: st.just(c.replace(seq_k=c.seq_k + 1))
    declared = attention_cases(caps, profile=profile)
    edits = {what: on_first_sequence(edit) for what, edit in edits.items()}   # packed cases too
    return st.tuples(st.sampled_from(sorted(edits)), declared).flatmap(
        lambda pair: edits[pair[0]](pair[1]).map(lambda case, what=pair[0]: (what, case)))
