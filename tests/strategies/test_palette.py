"""Compile palettes (strategies/palette.py) and the compile variants of triton_fa2: a campaign on a
compiled kernel repeats its variants without giving up ragged lengths."""
from __future__ import annotations

import dataclasses
import inspect
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from compile_recorder import RECORD_ENV
from fuzzattn.campaigns.campaign import fuzz
from fuzzattn.campaigns.compile_ahead import CompileAhead, compile_ahead
from fuzzattn.campaigns.compile_palette import campaign_palette
from fuzzattn.campaigns.rotation import (EVERY, MIN_TURN, TURNS, PaletteRotation, RotatingCases,
                                         cases_per_turn)
from fuzzattn.contract.profiles import PROFILES
from fuzzattn.run import registry
from fuzzattn.run.loader import load_implementation
from fuzzattn.kernels import triton_fa2, triton_fa2_backward
from fuzzattn.strategies import attention_cases
from fuzzattn.strategies.cases import variant_combinations
from fuzzattn.strategies.configs import valid_configs
from fuzzattn.strategies.layouts import layout_choices
from fuzzattn.strategies.lengths import head_dim_choices
from fuzzattn.strategies.palette import CHOICES_PER_AXIS, dim_class, head_dim_subset, in_turn, subset


def test_a_subset_keeps_the_first_choice_and_is_the_same_everywhere():
    choices = list(range(40))
    for number in range(20):
        picked = subset(choices, number, "head_dim")
        assert picked[0] == 0 and len(picked) == CHOICES_PER_AXIS == len(set(picked))
        assert picked == subset(choices, number, "head_dim")      # no salted hash involved
    # Different numbers and different axes pick different subsets: the shards of a run spread.
    assert len({tuple(subset(choices, n, "head_dim")) for n in range(20)}) > 10
    assert subset(choices, 3, "layout") != subset(choices, 3, "head_dim")
    assert subset([7], 5, "config") == [7]


def test_a_palette_narrows_layouts_head_dims_configurations_and_variant_combinations():
    impl = registry.get("triton_fa2")
    profile = PROFILES["gpu"]
    layouts = set(subset(layout_choices(impl.caps), 4, "layout"))
    seen = []

    # derandomized: "every head dim of the group comes in 150 cases" is a fact about these
    # draws, not a bound on every random 150 (the suite's dev profile draws at random)
    @settings(max_examples=150, database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(attention_cases(impl.caps, dtype="float16", profile=profile, palette=4))
    def draw(case):
        seen.append(case)

    draw()
    assert {c.layout for c in seen} <= layouts
    for case in seen:
        allowed = subset(valid_configs(impl.caps, case), 4, "config")
        assert case.config in allowed
    # Head dims come from one group a compiled kernel builds the same binaries for: one class
    # (BLOCK_D), row strides all divisible by 16 or none; lengths stay free: ragged, tile
    # multiples and single rows all still come.
    dims = head_dim_choices(impl.caps.head_dims, max_head_dim=impl.caps.max_head_dim)
    drawn_dims = {c.head_dim for c in seen}
    assert drawn_dims == set(head_dim_subset(dims, 4))
    assert len({(dim_class(d), d % 16 == 0) for d in drawn_dims}) == 1
    lengths = {n for c in seen for n in (c.seq_q, c.seq_k)}
    assert any(n % 16 for n in lengths) and any(n and n % 16 == 0 for n in lengths)
    assert len(lengths) > 40
    # The variants: plain cases and one combination of the declared ones, not all four.
    combos = in_turn(variant_combinations(impl.caps), 4)
    assert len(combos) == CHOICES_PER_AXIS < len(variant_combinations(impl.caps)) == 4
    used = {tuple(name for name, on in (("window", c.windowed), ("softcap", bool(c.softcap))) if on)
            for c in seen}
    assert used <= set(combos) and () in used and len(used) == 2


def test_without_a_palette_every_variant_combination_comes():
    impl = registry.get("triton_fa2")
    seen = set()

    @settings(max_examples=150, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(attention_cases(impl.caps, dtype="float16", profile=PROFILES["gpu"]))
    def draw(case):
        seen.add((case.windowed, bool(case.softcap)))

    draw()
    assert seen == {(False, False), (True, False), (False, True), (True, True)}


def test_only_compiled_triton_kernels_draw_from_a_palette(monkeypatch):
    sdpa, triton = registry.get("sdpa"), registry.get("triton_fa2")
    monkeypatch.delenv("FUZZATTN_PALETTE", raising=False)
    assert campaign_palette(sdpa, 7) is None
    import fuzzattn.campaigns.compile_palette as module
    monkeypatch.setattr(module, "is_interpreted", lambda: True)
    assert campaign_palette(triton, 7) is None        # the interpreter compiles nothing
    monkeypatch.setattr(module, "is_interpreted", lambda: False)
    assert campaign_palette(triton, 7) == 7
    monkeypatch.setenv("FUZZATTN_PALETTE", "off")
    assert campaign_palette(triton, 7) is None
    monkeypatch.setattr(module, "is_interpreted", lambda: True)
    monkeypatch.setenv("FUZZATTN_PALETTE", "on")
    assert campaign_palette(triton, 7) == 7 and campaign_palette(sdpa, 7) is None
    monkeypatch.setenv("FUZZATTN_PALETTE", "sometimes")
    with pytest.raises(ValueError, match="FUZZATTN_PALETTE='sometimes' is not one of auto, off, on"):
        campaign_palette(triton, 7)


@pytest.mark.parametrize("kernel, names", [
    (triton_fa2.fa2_fwd_kernel, triton_fa2.FORWARD_UNSPECIALIZED),
    (triton_fa2_backward.bwd_preprocess_kernel, triton_fa2_backward.PREPROCESS_UNSPECIALIZED),
    (triton_fa2_backward.bwd_dkdv_kernel, triton_fa2_backward.GRADIENT_UNSPECIALIZED),
    (triton_fa2_backward.bwd_dq_kernel, triton_fa2_backward.GRADIENT_UNSPECIALIZED)],
    ids=["forward", "preprocess", "dkdv", "dq"])
def test_unspecialised_arguments_are_real_scalars_of_the_kernel(kernel, names):
    """Triton ignores a do_not_specialize name that is not a parameter: a typo would silently
    keep the compile per length. Each name is a parameter of the kernel (the dK/dV and dQ kernels
    share one list, each has the part for its own outputs), and none of them is a row or element
    stride, which shape the tile's addressing and stay specialised."""
    params = inspect.signature(getattr(kernel, "fn", kernel)).parameters
    own = [n for n in names if n in params]
    assert own and all(not n.endswith(("m", "n", "d")) or not n.startswith("stride_") for n in own)
    assert {"N_QUERIES", "HEAD_DIM"} <= set(own)
    missing = [n for n in names if n not in params and not n.startswith(("stride_dq", "stride_dk",
                                                                          "stride_dv"))]
    assert not missing, f"not parameters of {kernel}: {missing}"


def test_a_dtype_planned_per_shape_draws_from_a_shape_palette_and_the_others_do_not():
    """SDPA's default dispatch on CUDA plans per shape in bf16/fp16 only (cuDNN): those
    campaigns draw a few fixed shapes, fp32's stay free, and nothing else about them changes."""
    sdpa = registry.get("sdpa")
    impl = dataclasses.replace(sdpa, caps=dataclasses.replace(
        sdpa.caps, plans_per_shape={"bfloat16", "float16"}, palette_shapes=3))
    assert campaign_palette(impl, 5, "bfloat16") == 5
    assert campaign_palette(impl, 5, "float32") is None and campaign_palette(impl, 5) is None
    assert campaign_palette(sdpa, 5, "bfloat16") is None     # the CPU build plans nothing

    def shapes(dtype):
        seen = set()

        @settings(max_examples=80, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(attention_cases(impl.caps, dtype=dtype, profile=PROFILES["gpu"],
                               palette=campaign_palette(impl, 5, dtype)))
        def draw(case):
            seen.add((case.batch, case.heads, case.seq_q, case.seq_k, case.head_dim, case.layout))

        draw()
        return seen

    assert len(shapes("bfloat16")) <= 3 < len(shapes("float32"))


# -- rotation and compile-ahead ------------------------------------------------------------------
RECORDER_FILE = Path(__file__).resolve().parents[1] / "compile_recorder.py"


def test_a_rotation_steps_by_the_shards_so_shards_never_share_a_palette():
    shards, turns = 16, 40
    seen = [{PaletteRotation(seed * shards + i, shards).palette(t) for t in range(turns)}
            for seed in (0,) for i in range(shards)]
    assert all(len(palettes) == turns for palettes in seen)
    assert sum(len(p) for p in seen) == len(set().union(*seen))      # pairwise disjoint
    rotation = PaletteRotation(5, 16, every=100)
    assert [rotation.palette(rotation.turn(n)) for n in (0, 99, 100, 250)] == [5, 5, 21, 37]
    with pytest.raises(ValueError, match="every=0 must be at least 1"):
        PaletteRotation(0, 1, every=0)


def test_the_union_over_a_rotation_covers_every_head_dim_class_and_variant_combination():
    impl = registry.get("triton_fa2")
    dims = head_dim_choices(impl.caps.head_dims, max_head_dim=impl.caps.max_head_dim)
    rotation = PaletteRotation(3, 16)
    palettes = [rotation.palette(t) for t in range(12)]
    assert {dim_class(d) for p in palettes for d in head_dim_subset(dims, p)} == {
        dim_class(d) for d in dims}
    assert {c for p in palettes for c in in_turn(variant_combinations(impl.caps), p)
            } == set(variant_combinations(impl.caps))
    # A run of 16 shards covers every head dim within two turns.
    assert {d for p in range(2 * 16) for d in head_dim_subset(dims, p)} == set(dims)


def _rotating(impl, first: int, step: int, every: int, ahead=None) -> RotatingCases:
    def cases(palette):
        return attention_cases(impl.caps, dtype="float32", profile=PROFILES["ci"], palette=palette)
    return RotatingCases(PaletteRotation(first, step, every), cases, ahead=ahead)


def _differing_turns(impl) -> tuple[int, int]:
    """(first, step): a rotation whose second palette draws a head dim class its first does not."""
    dims = sorted(impl.caps.head_dims)
    for first in range(20):
        if set(head_dim_subset(dims, first)) != set(head_dim_subset(dims, first + 3)):
            return first, 3
    raise AssertionError("no two palettes differ")


def test_a_campaign_moves_to_its_next_palette_every_so_many_cases(tmp_path):
    impl = load_implementation(f"{RECORDER_FILE}:RECORDER", probe=False)
    first, step = _differing_turns(impl)
    rotation = _rotating(impl, first, step, every=8)
    drawn = []
    strategy = rotation.strategy().map(lambda case: drawn.append((rotation.palette, case)) or case)
    result = fuzz(impl, strategy, max_examples=24, save_to_file=False, rotation=rotation)
    assert result.counterexample is None and result.cases >= 24
    assert rotation.palettes == [first, first + step, first + 2 * step]
    dims = sorted(impl.caps.head_dims)
    for palette, case in drawn:
        assert case.head_dim in head_dim_subset(dims, palette)
    assert {p for p, _ in drawn} == set(rotation.palettes)


def test_a_failure_found_after_a_rotation_still_shrinks_and_replays(tmp_path):
    """BUGGY fails on head dim 64 only: a palette without class 64 cannot find it, the next one
    does; its shrink and final replay draw from the palette it came from (no FlakyFailure)."""
    impl = load_implementation(f"{RECORDER_FILE}:BUGGY", probe=False)
    dims = sorted(impl.caps.head_dims)
    first = next(p for p in range(40) if 64 not in head_dim_subset(dims, p)
                 and 64 in head_dim_subset(dims, p + 1))
    rotation = _rotating(impl, first, 1, every=10)
    result = fuzz(impl, rotation.strategy(), max_examples=60, save_to_file=False,
                  rotation=rotation)
    assert result.error is None and len(rotation.palettes) >= 2
    found = result.counterexample
    assert found is not None and found.judged.case.head_dim == 64
    case, defect = found.judged.case, result.defects[0]
    assert defect.shrunk and not defect.shrink_note
    assert (case.batch, case.heads) == (1, 1) and case.seq_q + case.seq_k <= 4


def test_the_pool_compiles_the_next_palette_before_the_campaign_moves_to_it(tmp_path, monkeypatch):
    record = tmp_path / "calls"
    monkeypatch.setenv(RECORD_ENV, str(record))
    spec = f"{RECORDER_FILE}:RECORDER"
    impl = load_implementation(spec, probe=False)
    first, step = _differing_turns(impl)
    ahead = CompileAhead(spec, "float32", "ci", cases=40, wait=600)
    rotation = _rotating(impl, first, step, every=12, ahead=ahead)
    begin = rotation.begin

    def marked(turn, **kw):     # a line in the record where the campaign moves on
        begin(turn, **kw)
        with open(record, "a") as f:
            f.write(f"{os.getpid()} turn {rotation.palette}\n")
    rotation.begin = marked
    try:
        fuzz(impl, rotation.strategy(), max_examples=24, save_to_file=False, rotation=rotation)
        assert not ahead.pending       # the budget's last turn had no next palette warmed
    finally:
        ahead.close()
    lines = [line.split() for line in record.read_text().splitlines()]
    ours = str(os.getpid())
    moved = lines.index([ours, "turn", str(first + step)])
    calls_before = [line for line in lines[:moved] if line[1] != "turn"]
    judged_first = {v for pid, v in calls_before if pid == ours}
    warmed = {v for pid, v in calls_before if pid != ours}
    judged_next = {line[1] for line in lines[moved + 1:] if line[0] == ours}
    # The next palette brought variants the first never drew, and the pool had run every one
    # the campaign then drew, before it moved on.
    assert judged_next - judged_first
    assert judged_next <= warmed


def test_compile_ahead_is_opt_in_and_off_where_nothing_compiles(monkeypatch):
    import fuzzattn.triton_interpreter.backend as backend
    monkeypatch.delenv("FUZZATTN_COMPILE_AHEAD", raising=False)
    monkeypatch.setattr(backend, "is_interpreted", lambda: False)
    assert compile_ahead(registry.get("triton_fa2"), "float16", "gpu") is None   # the default
    monkeypatch.setenv("FUZZATTN_COMPILE_AHEAD", "on")
    ahead = compile_ahead(registry.get("triton_fa2"), "float16", "gpu", turn_cases=25)
    assert isinstance(ahead, CompileAhead) and ahead.cases == 25   # no more than a turn holds
    assert compile_ahead(registry.get("sdpa"), "float16", "gpu") is None
    monkeypatch.setattr(backend, "is_interpreted", lambda: True)
    assert compile_ahead(registry.get("triton_fa2"), "float16", "gpu") is None   # interpreted
    monkeypatch.setenv("FUZZATTN_COMPILE_AHEAD", "always")
    with pytest.raises(ValueError, match="FUZZATTN_COMPILE_AHEAD='always' is not one of on, off"):
        compile_ahead(registry.get("triton_fa2"), "float16", "gpu")


def test_a_campaign_never_waits_for_a_warm_up_past_its_time_cap():
    """A warm-up still running when the campaign moves on is waited for at most until the
    campaign's cap ends (`until`), not the pool's whole `wait`."""
    import time

    class Silent:                 # a warm-up's pipe end that never answers
        def poll(self, timeout):
            waited.append(timeout)
            return False
    waited = []
    ahead = CompileAhead("triton_fa2", "float16", "gpu", wait=120.0)
    ahead.pending[7] = (None, Silent())
    assert ahead.ready(7, until=time.perf_counter() + 2.0) is None
    assert ahead.ready(7, until=time.perf_counter() - 5.0) is None      # the cap already spent
    assert ahead.ready(7) is None
    assert 1.5 < waited[0] <= 2.0 and waited[1] == 0.0 and waited[2] == 120.0, waited
    ahead.pending.clear()


def test_a_campaign_with_a_case_budget_sees_several_palettes():
    """A 100-case campaign (a mutant's, the gate's) spans TURNS palettes, so the variant
    combinations of palettes 0..3 (plain plus softcap, window, ...) are all drawn; a campaign
    bounded by time only keeps a palette EVERY cases."""
    assert cases_per_turn(None) == EVERY
    assert cases_per_turn(100) == 25 and cases_per_turn(100_000) == EVERY
    assert cases_per_turn(10) == MIN_TURN
    combos = {tuple(sorted(set().union(*variants)))
              for variants in (in_turn(variant_combinations(triton_fa2.CAPS), p)
                               for p in range(TURNS))}
    assert any("window" in c for c in combos) and any("softcap" in c for c in combos), combos


@pytest.mark.parametrize("first", [0, 1, 7, 1000])
def test_consecutive_palettes_take_every_variant_combination_in_turn(first):
    """Whatever a campaign's first palette, its next len - 1 palettes (turns, or shards side by
    side) meet every combination of the declared variants, the plain cases in each."""
    for caps in (triton_fa2.CAPS, dataclasses.replace(triton_fa2.CAPS, alibi=True,
                                                      paged_kv=True)):
        combos = variant_combinations(caps)
        taken = [in_turn(combos, p) for p in range(first, first + len(combos) - 1)]
        assert all(t[0] == () and len(t) == CHOICES_PER_AXIS for t in taken)
        assert {t[1] for t in taken} == set(combos[1:])
