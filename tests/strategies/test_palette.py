"""Compile palettes (strategies/palette.py) and the compile variants of triton_fa2: a campaign on a
compiled kernel repeats its variants without giving up ragged lengths."""
from __future__ import annotations

import dataclasses
import inspect

import pytest
from hypothesis import HealthCheck, given, settings

from fuzzattn.campaigns.compile_palette import campaign_palette
from fuzzattn.contract.profiles import PROFILES
from fuzzattn.run import registry
from fuzzattn.kernels import triton_fa2, triton_fa2_backward
from fuzzattn.strategies import attention_cases
from fuzzattn.strategies.cases import variant_combinations
from fuzzattn.strategies.configs import valid_configs
from fuzzattn.strategies.layouts import layout_choices
from fuzzattn.strategies.lengths import head_dim_choices
from fuzzattn.strategies.palette import CHOICES_PER_AXIS, subset


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


def test_a_palette_narrows_only_layouts_configurations_and_variant_combinations():
    impl = registry.get("triton_fa2")
    profile = PROFILES["gpu"]
    layouts = set(subset(layout_choices(impl.caps), 4, "layout"))
    seen = []

    @settings(max_examples=150, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(attention_cases(impl.caps, dtype="float16", profile=profile, palette=4))
    def draw(case):
        seen.append(case)

    draw()
    assert {c.layout for c in seen} <= layouts
    for case in seen:
        allowed = subset(valid_configs(impl.caps, case), 4, "config")
        assert case.config in allowed
    # Head dims stay free (a palette of two let head-dim bugs of the zoo survive), and so do
    # lengths: ragged, tile multiples and single rows all still come.
    dims = head_dim_choices(impl.caps.head_dims, max_head_dim=impl.caps.max_head_dim)
    assert len({c.head_dim for c in seen}) > len(dims) // 2
    lengths = {n for c in seen for n in (c.seq_q, c.seq_k)}
    assert any(n % 16 for n in lengths) and any(n and n % 16 == 0 for n in lengths)
    assert len(lengths) > 40
    # The variants: plain cases and one combination of the declared ones, not all four.
    combos = subset(variant_combinations(impl.caps), 4, "variants")
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
