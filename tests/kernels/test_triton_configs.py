"""triton_fa2 across its configuration space: every sampled configuration matches the oracle, bad
configurations are refused in one line, and the tile-shape mutants hide in some configurations
and show in others (so a fuzzer that draws configurations is needed to catch them)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from fuzzattn import AttentionCase
from fuzzattn.contract import autotune
from fuzzattn.contract import UnsupportedCaseError
from fuzzattn.inputs.materialize import materialize
from fuzzattn.judgement.judge import default_device, judge
from fuzzattn.triton_interpreter.backend import is_interpreted
from fuzzattn.run.registry import implementations, mutants
from fuzzattn.kernels import triton_fa2
from fuzzattn.kernels.triton_fa2 import (ALL_CONFIGS, AUTOTUNE_CONFIGS, BASELINE_CONFIG, config_invalid,
                                fa2_fwd_autotuned, triton_fa2_forward)


DEVICE = default_device()     # compiled on a GPU, interpreted on the CPU


def cfg(block_m=16, block_n=16, num_warps=4, num_stages=1) -> dict:
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": num_warps, "num_stages": num_stages}


def cfg_id(config: dict) -> str:
    return f"{config['BLOCK_M']}x{config['BLOCK_N']}w{config['num_warps']}s{config['num_stages']}"


def pinned(impl, config: dict):
    """`impl` with every configless case run at `config` (its declared default_config's keys
    replaced: the engine passes it as it passes a drawn configuration)."""
    default = {**dict(impl.caps.default_config), **config}
    return dataclasses.replace(impl, caps=dataclasses.replace(impl.caps, default_config=default))


def case(seq_q=1, seq_k=1, head_dim=16, *, batch=1, heads=1, kv_heads=None, **kw) -> AttentionCase:
    return AttentionCase(batch=batch, heads=heads, kv_heads=kv_heads or heads, seq_q=seq_q,
                         seq_k=seq_k, head_dim=head_dim, **kw)


# Tile shapes that exercise each stage boundary: square, BLOCK_M < BLOCK_N, BLOCK_M > BLOCK_N,
# the extremes of the space; warps and stages vary too (the interpreter ignores them, the
# compiled kernel does not).
SAMPLE_CONFIGS = [
    BASELINE_CONFIG,
    cfg(16, 32, num_warps=1),
    cfg(32, 16, num_stages=2),
    cfg(64, 64, num_warps=8, num_stages=3),
    cfg(128, 16, num_warps=4),
    cfg(16, 128, num_stages=3),
    cfg(32, 64, num_warps=2, num_stages=2),
]

# Shapes: ragged in both lengths, Nq != Nk both ways (bottom-right rows that see no key), GQA,
# every kind of strided layout, low precision, D not a power of two.
SHAPES = [
    case(37, 53, 24, heads=4, kv_heads=2),
    case(37, 53, 24, heads=4, kv_heads=2, causal="top_left"),
    case(37, 53, 24, heads=2, kv_heads=1, causal="bottom_right"),
    case(70, 33, 16, causal="bottom_right", layout=("transposed", "sliced", "contiguous")),
    case(70, 33, 16, causal="top_left", layout=("contiguous", "broadcast_heads", "broadcast_heads"),
         heads=2, kv_heads=2),
    case(48, 130, 40, causal="bottom_right", dtype="bfloat16", values="large"),
    case(33, 33, 64, causal="top_left", dtype="float16", batch=2,
         layout=("sliced", "transposed", "broadcast_batch")),
    case(20, 17, 8, scale=0.3, dtype="float16", values="dominant_key"),
]


@pytest.mark.parametrize("config", SAMPLE_CONFIGS, ids=cfg_id)
@pytest.mark.parametrize("the_case", SHAPES, ids=str)
def test_every_sampled_configuration_matches_the_oracle(config, the_case):
    assert config_invalid(config, the_case.head_dim) is None
    report = judge(pinned(triton_fa2.IMPL, config), the_case)
    if report.skipped:
        pytest.skip(report.skipped)
    assert report.passed, report.describe()


@pytest.mark.skipif(not is_interpreted(), reason="compiled, no configuration means the autotuner")
def test_no_config_runs_the_baseline_under_the_interpreter():
    the_case = case(37, 53, 24, causal="bottom_right")
    inputs = materialize(the_case, DEVICE)
    args = dict(causal="bottom_right", scale=the_case.softmax_scale)
    default = triton_fa2_forward(inputs.q, inputs.k, inputs.v, **args)
    baseline = triton_fa2_forward(inputs.q, inputs.k, inputs.v, **args, config=BASELINE_CONFIG)
    for a, b in zip(default, baseline):
        assert torch.equal(a, b)


def test_a_configless_case_runs_the_baseline_compiled_or_interpreted():
    """The registered implementation's default_config: a case naming no configuration runs the
    article's tiles on every machine (compiled, the kernel function alone would autotune)."""
    the_case = case(37, 53, 24, causal="bottom_right")
    inputs = materialize(the_case, DEVICE)
    configless = triton_fa2.IMPL(inputs.q, inputs.k, inputs.v, the_case)
    baseline = triton_fa2_forward(inputs.q, inputs.k, inputs.v, causal="bottom_right",
                                  scale=the_case.softmax_scale, config=BASELINE_CONFIG)
    for a, b in zip(configless, baseline):
        assert torch.equal(a, b)
    assert triton_fa2.IMPL.caps.pass_config(the_case, backward=True) == {
        "BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}


# -- the configuration space and its validation ---------------------------------------------------
def test_the_first_choice_of_every_axis_is_the_articles_kernel():
    assert BASELINE_CONFIG == cfg(16, 16, num_warps=4, num_stages=1)
    assert ALL_CONFIGS[0] == BASELINE_CONFIG
    assert len(ALL_CONFIGS) == len({cfg_id(c) for c in ALL_CONFIGS}) == 4 * 4 * 4 * 3
    for d in range(1, 257):                 # the article's kernel runs every head dim and dtype
        assert config_invalid(BASELINE_CONFIG, d) is None


def test_resource_estimates_refuse_big_tiles_and_depend_on_dtype():
    big = cfg(128, 128, num_warps=4, num_stages=3)
    assert "shared memory" in config_invalid(big, 256)
    assert "registers" in config_invalid(cfg(128, 64, num_warps=1), 128)
    # fp32 operands take twice the shared memory of bf16: None assumes the widest.
    tile = cfg(128, 64, num_warps=8, num_stages=3)
    assert config_invalid(tile, 128) is not None
    assert config_invalid(tile, 128, dtype=torch.bfloat16) is None
    # Every head dim keeps several configurations of each tile shape family.
    for d in (16, 64, 128, 256):
        assert sum(config_invalid(c, d) is None for c in ALL_CONFIGS) >= 20, d


BAD_CONFIGS = [
    pytest.param({**BASELINE_CONFIG, "BLOCK_K": 16}, "unknown key 'BLOCK_K'", id="unknown key"),
    pytest.param({k: v for k, v in BASELINE_CONFIG.items() if k != "num_stages"},
                 "missing key 'num_stages'", id="missing key"),
    pytest.param({**BASELINE_CONFIG, "BLOCK_M": 48}, "BLOCK_M=48 is outside", id="BLOCK_M=48"),
    pytest.param({**BASELINE_CONFIG, "num_warps": True}, "num_warps=True is outside", id="bool"),
    pytest.param((16, 16, 4, 1), "must be a dict", id="tuple"),
    pytest.param(cfg(128, 128, num_warps=1, num_stages=3), "fit head_dim=256", id="too big"),
]


@pytest.mark.parametrize("config, message", BAD_CONFIGS)
def test_bad_configurations_are_refused_in_one_line(config, message):
    inputs = materialize(case(3, 5, 256), DEVICE)
    with pytest.raises(UnsupportedCaseError, match=message) as excinfo:
        triton_fa2_forward(inputs.q, inputs.k, inputs.v, causal=False, scale=0.1, config=config)
    assert "\n" not in str(excinfo.value)


# -- fuzzattn.contract.autotune on the repo's own kernel ---------------------------------------------------
def test_the_autotuner_lists_its_dozen_and_pins_without_being_changed():
    listed = autotune.configs(fa2_fwd_autotuned)
    assert listed == AUTOTUNE_CONFIGS and all(c in ALL_CONFIGS for c in listed)
    configs_before, cache_before = list(fa2_fwd_autotuned.configs), dict(fa2_fwd_autotuned.cache)
    inputs = materialize(case(20, 20, 16), DEVICE)
    # a point of the space the autotuner does not time, and one it does
    for config in (cfg(32, 16), AUTOTUNE_CONFIGS[-1]):
        out, lse = triton_fa2_forward(inputs.q, inputs.k, inputs.v, causal=True, scale=0.25,
                                      config=config)
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert fa2_fwd_autotuned.configs == configs_before and fa2_fwd_autotuned.cache == cache_before
    with pytest.raises(ValueError, match="not one of the autotuner's 12"):
        autotune.launch_pinned(fa2_fwd_autotuned, (1,), config={"BLOCK_M": 8})


# -- mutants that only some configurations show ----------------------------------------------------
# mutant -> (case, a configuration under which it passes, one under which it is caught)
CONFIG_MUTANTS = {
    # Top-left, Nq = Nk: with 16x16 tiles every tile starts on a key-block boundary; with
    # BLOCK_M=16 < BLOCK_N=32 the second tile starts mid-block and the stages overlap.
    "mutant_diagonal_bounds_block_m_lt_n": (case(32, 32, causal="top_left"), cfg(16, 16), cfg(16, 32)),
    # Nk = 48 is whole 16-key blocks but ends a 32-key block half way.
    "mutant_maskfree_ragged_tail": (case(8, 48), cfg(16, 16), cfg(32, 32)),
    # With 16x16 tiles the last visible key of a tile ends a key block; with 16x32 half the
    # tiles end mid-block, and that block is skipped.
    "mutant_skip_off_by_one_block": (case(48, 48, causal="top_left"), cfg(32, 16), cfg(16, 32)),
}


@pytest.mark.parametrize("name", sorted(CONFIG_MUTANTS))
def test_configuration_mutant_hides_in_one_configuration_and_shows_in_another(name):
    the_case, hides, shows = CONFIG_MUTANTS[name]
    real, mutant = implementations()["triton_fa2"], mutants()[name]
    for config in (hides, shows):
        assert judge(pinned(real, config), the_case).passed
    hidden = judge(pinned(mutant, config=hides), the_case)
    assert hidden.passed, f"{name} was expected to hide under {cfg_id(hides)}: {hidden.describe()}"
    shown = judge(pinned(mutant, config=shows), the_case)
    assert not shown.passed, f"{name} survived {the_case} under {cfg_id(shows)}"


def test_lse_base2_shows_in_every_configuration():
    """Not a tile-shape bug: the missing ln 2 shows whatever the configuration."""
    mutant = mutants()["mutant_lse_base2"]
    for config in SAMPLE_CONFIGS[:4]:
        assert not judge(pinned(mutant, config), case(5, 9, causal="bottom_right")).passed


def test_every_triton_mutant_accepts_a_configuration():
    """Every mutant of triton_fa2 takes `config=` and hands it to the real launcher: pinned to a
    point of the space it is judged (passes or is caught, never skipped, refused or a crash),
    and a point outside the space is refused by the launcher's validation, which a mutant that
    dropped the configuration (and ran the baseline) would not reach."""
    the_case = case(3, 5)
    inputs = materialize(the_case, DEVICE)
    outside = {**BASELINE_CONFIG, "BLOCK_M": 48}
    triton_mutants = [m for m in mutants().values() if m.mutant_of == "triton_fa2"]
    assert triton_mutants
    for mutant in triton_mutants:
        report = judge(pinned(mutant, cfg(32, 64)), the_case)
        assert report.skipped is None and report.refused is None, report.describe()
        assert "crash" not in [v.check for v in report.failures], report.describe()
        with pytest.raises(UnsupportedCaseError, match="BLOCK_M=48 is outside"):
            mutant.fn(inputs.q, inputs.k, inputs.v, causal=False, scale=0.25, config=outside)
