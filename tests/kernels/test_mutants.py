"""The mutant zoo: registered apart from the real kernels, each one caught by the check meant for it.

The full self-test (`fuzzattn mutants`: the default campaign against every mutant) takes minutes
under Triton's interpreter; this file is the fast subset. Every mutant is judged on one
hand-picked case that shows its bug (and on which the real kernel it derives from passes), and a
few representative ones are fuzzed with a small campaign.
"""
from __future__ import annotations

import dataclasses

import pytest

from fuzzattn import AttentionCase, Implementation
from fuzzattn.contract import profiles
from fuzzattn.campaigns.campaign import fuzz
from fuzzattn.judgement.judge import judge
from fuzzattn.run.registry import implementations, mutants
from fuzzattn.kernels.mutants import MUTANTS
from fuzzattn.kernels.mutants.edit import EditError, apply_edits
from fuzzattn.kernels.sdpa import IMPL as SDPA, sdpa_forward
from fuzzattn.strategies.cases import attention_cases


def case(seq_q=1, seq_k=1, head_dim=16, *, batch=1, heads=1, kv_heads=None, **kw) -> AttentionCase:
    return AttentionCase(batch=batch, heads=heads, kv_heads=kv_heads or heads, seq_q=seq_q,
                         seq_k=seq_k, head_dim=head_dim, **kw)


# mutant -> (a small case that shows the bug, the check expected to catch it). The expected
# checks pin the mechanism: e.g. a store past Nq must be caught by the canary, not by luck.
CAUGHT_BY = {
    # Triton kernel edits
    "mutant_phantom_keys": (case(), "out"),
    "mutant_noop_p_cast": (case(dtype="float16"), "crash"),
    "mutant_tile_index_as_row": (case(seq_q=18), "unwritten_output"),
    "mutant_lse_store_unmasked": (case(), "out_of_bounds_write"),
    # The rows past Nk that it reads start with the input's NaN guard and go on into whatever
    # memory follows; re-run with a zeroed guard, that memory may still hold NaN.
    "mutant_v_load_unmasked": (case(), {"out_of_bounds_read", "nonfinite"}),
    "mutant_q_load_past_head_dim": (case(head_dim=24), "out_of_bounds_read"),
    # The row that sees no key ends as out 0, lse -inf; the judge names a lse-only -inf by its
    # out-based attribution, so any of the non-finite labels is accepted here.
    "mutant_causal_off_by_one": (case(causal="top_left"), {"nonfinite", "unwritten_output"}),
    "mutant_finite_sentinel": (case(values="below_sentinel"), {"out", "lse"}),
    # Sentinels at other magnitudes, whose kernels take a row whose max stayed at the sentinel
    # for empty (so empty rows cannot give them away): only scores past them can. sentinel_sweep
    # puts these cases' scores at -1.07e9 (-1.55e9 in base 2), -32768 (past fp16's lowest halved)
    # and -16384; the rows these kernels think empty come back as -inf lse, or P as inf.
    "mutant_sentinel_minus_1e9": (case(2, 3, causal="top_left", values="sentinel_sweep",
                                       data_seed=46), {"nonfinite", "lse"}),
    "mutant_sentinel_half_dtype_min": (case(2, 3, causal="top_left", values="sentinel_sweep",
                                            data_seed=4, dtype="float16"), {"nonfinite", "out", "lse"}),
    "mutant_bwd_sentinel_minus_1e4": (case(2, 3, causal="top_left", values="sentinel_sweep",
                                           data_seed=40), {"grad_nonfinite", "grad_dq"}),
    "mutant_lse_base2": (case(seq_k=2), "lse"),
    "mutant_head_dim_truncated": (case(head_dim=64), {"out", "lse"}),
    "mutant_gqa_modulo": (case(heads=4, kv_heads=2), "out"),
    "mutant_row_sum_low_precision": (case(seq_k=3, dtype="float16"), "lse"),
    "mutant_no_running_max": (case(values="large"), "nonfinite"),
    "mutant_row_sum_not_rescaled": (case(seq_k=32), {"out", "lse"}),
    # Triton configuration-dependent bugs, here on the 16x16 baseline through a shape that shows
    # them there too (tests/kernels/test_triton_configs.py pins the tile shapes that show them alone)
    "mutant_diagonal_bounds_block_m_lt_n": (case(seq_q=16, seq_k=40, causal="bottom_right"), "out"),
    # Keys 3..15 are read from the input's NaN guard, or past it when re-run with a zeroed guard.
    "mutant_maskfree_ragged_tail": (case(seq_k=3), {"out_of_bounds_read", "nonfinite"}),
    "mutant_skip_off_by_one_block": (case(seq_q=16, seq_k=17, causal="bottom_right"), "out"),
    # One query, 20 keys, window (5, -1): keys 14..19 are kept; rounding 14 up skips 14 and 15.
    "mutant_window_skip_rounds_up": (case(seq_k=20, window=(5, -1)), {"out", "lse"}),
    # Triton launch errors
    "mutant_grid_floor": (case(), "unwritten_output"),
    "mutant_packed_kv_strides": (case(seq_k=2, heads=2, layout=("contiguous", "transposed", "contiguous")), "out"),
    "mutant_scale_ignored": (case(scale=0.5), {"out", "lse"}),
    # torch_tiled edits
    "mutant_bottom_right_as_top_left": (case(seq_k=2, causal="bottom_right"), "out"),
    "mutant_bottom_right_offset_sign": (case(seq_q=3, causal="bottom_right"), "empty_rows"),
    # Never-written memory: NaN in the first run (torch fills uninitialised memory), zeros in the
    # attribution re-runs (judge zeroes every empty tensor), whatever the heap held before.
    "mutant_tail_rows_unwritten": (case(seq_q=3), "unwritten_output"),
    "mutant_scales_q_in_place": (case(), "inputs_mutated"),
    "mutant_empty_rows_nan": (case(seq_q=2, causal="bottom_right"), "nonfinite"),
    "mutant_mqa_squeeze": (case(batch=2, heads=2, kv_heads=1), "out"),
    # Precision bugs: every element stays under the max rule; the rms over the tensor does not.
    "mutant_acc_bf16": (case(seq_q=32, seq_k=80, head_dim=32, heads=2, dtype="bfloat16"), "out_rms"),
    "mutant_acc_fp16": (case(seq_q=32, seq_k=80, head_dim=32, heads=2, dtype="float16"), "out_rms"),
    # The weakest of them: a P @ V product rounded once per key block (11.9x the bound here,
    # on exact_mean values, where the reference is exact).
    "mutant_pv_low_precision": (case(seq_q=65, seq_k=55, head_dim=80, batch=2, heads=2,
                                     dtype="bfloat16", causal="bottom_right", scale=0.5,
                                     values="exact_mean", data_seed=160953), "out_rms"),
    "mutant_running_max_bf16": (case(seq_k=32), {"out", "lse"}),
    # Shape-family bugs: decode under top-left sees key 0 only; a chunk's alignment decides all.
    "mutant_decode_ignores_causal": (case(seq_k=2, causal="top_left"), "out"),
    "mutant_chunk_wrong_alignment": (case(seq_q=2, seq_k=4, causal="bottom_right"), {"out", "lse"}),
    # Variant bugs (tests/variants/test_variants.py fuzzes each too). One query, three keys: the window
    # (1, -1) keeps keys 1 and 2, (0, 0) key 2 alone.
    "mutant_window_edge_off_by_one": (case(seq_k=3, window=(1, -1)), {"out", "lse"}),
    "mutant_window_top_left": (case(seq_k=3, window=(0, 0)), {"out", "lse"}),
    "mutant_softcap_after_mask": (case(2, 2, causal="top_left", softcap=2.0), {"out", "lse"}),
    "mutant_softcap_unscaled": (case(seq_k=2, softcap=2.0), {"out", "lse"}),
    # One query, three keys: the right distances are 2, 1, 0; top-left ones 0, 1, 2.
    "mutant_alibi_wrong_sign": (case(seq_k=3, alibi="standard"), {"out", "lse"}),
    "mutant_alibi_top_left": (case(seq_k=3, alibi="standard"), {"out", "lse"}),
    # Two sequences of three keys in blocks of two, read as physical blocks 0-3 in order: another
    # sequence's keys, or a spare's NaN.
    "mutant_paged_logical_blocks": (case(batch=2, seq_k=3, causal="top_left", paged_kv=2),
                                    {"nonfinite", "out", "lse"}),
    # Packed varlen loop (tests/variants/test_varlen.py fuzzes each too): two sequences of one row each.
    "mutant_varlen_reads_next_sequence": (case(2, 2, seqlens_q=(1, 1), seqlens_k=(1, 1)), "out"),
    "mutant_varlen_drops_last_sequence": (case(2, 2, seqlens_q=(1, 1), seqlens_k=(1, 1)),
                                          "unwritten_output"),
    # Packed Triton kernel: the second sequence reads the first's key 0 for its key 2; one
    # query seeing two keys bottom-right sees both, as if square only the first.
    "mutant_triton_varlen_kv_not_offset": (case(2, 3, seqlens_q=(1, 1), seqlens_k=(2, 1)),
                                           {"out", "lse"}),
    "mutant_triton_varlen_square_diagonal": (case(2, 3, seqlens_q=(1, 1), seqlens_k=(2, 1),
                                                  causal="bottom_right"), {"out", "lse"}),
    # around SDPA
    "mutant_staging_buffer_aliasing": (case(), "lse"),
    "mutant_empty_rows_mean_v": (case(seq_q=2, causal="bottom_right"), "empty_rows"),
    "mutant_lse_unmasked": (case(seq_q=2, seq_k=2, causal="top_left"), "lse"),
    "mutant_assumes_contiguous": (case(seq_q=2, heads=2, layout=("transposed", "contiguous", "contiguous")), "lse"),
    "mutant_gqa_repeat": (case(heads=4, kv_heads=2), "out"),
    "mutant_batch_head_mixup": (case(batch=2, heads=2), "out"),
    "mutant_nondeterministic": (case(), "nondeterministic"),
    # autograd only: the forward is exact, its gradient is not
    "mutant_tiled_denominator_detached": (case(seq_k=2), "grad_dq"),
    # Triton backward (triton_fa2 with a mutated backward_fn): only gradient checks can see them.
    # A key no query sees (top-left, Nk > Nq) must get dk = dv = 0 exactly.
    "mutant_bwd_dkdv_ignores_causal": (case(seq_k=2, causal="top_left"), "grad_empty_rows"),
    "mutant_bwd_delta_from_dout": (case(seq_k=2), "grad_dq"),
    "mutant_bwd_ds_unscaled": (case(seq_k=2), "grad_dq"),
    "mutant_bwd_lse_base2": (case(seq_k=2), "grad_dq"),
    "mutant_bwd_gqa_first_head_only": (case(heads=2, kv_heads=1), "grad_dv"),
    "mutant_bwd_dq_skips_key_block": (case(seq_q=17, seq_k=17, causal="top_left", config=(
        ("bwd_BLOCK_M", 32), ("bwd_BLOCK_N", 16), ("bwd_num_stages", 1), ("bwd_num_warps", 4))),
        "grad_dq"),
    "mutant_bwd_dq_grid_floor": (case(seq_q=17), "grad_unwritten"),
}


def test_mutants_are_registered_apart_from_the_real_implementations():
    real = implementations()
    assert not [name for name, impl in real.items() if name.startswith("mutant_") or impl.mutant_of]
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)) >= 20
    assert set(mutants()) == set(names)
    for m in MUTANTS:
        assert m.name.startswith("mutant_"), m.name
        assert m.mutant_of in real, f"{m.name}: mutant_of={m.mutant_of!r}"
        assert m.description and "\n" not in m.description, m.name
        # Same declaration as the real kernel, so the fuzzer draws the cases that show the bug.
        assert m.caps == real[m.mutant_of].caps, m.name
        assert m.backend == real[m.mutant_of].backend, m.name


def test_every_mutant_has_a_hand_picked_case():
    assert set(CAUGHT_BY) == set(mutants())


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_mutant_is_caught_where_its_real_kernel_passes(name):
    mutant = mutants()[name]
    the_case, expected = CAUGHT_BY[name]
    real = judge(implementations()[mutant.mutant_of], the_case)
    assert real.passed or real.skipped, real.describe()
    report = judge(mutant, the_case)
    if report.skipped:
        pytest.skip(report.skipped)
    assert not report.passed, f"{name} survived {the_case}"
    expected = {expected} if isinstance(expected, str) else expected
    assert report.first_failure.check in expected, report.describe()


@pytest.mark.parametrize("name,dtype", [("mutant_acc_bf16", "bfloat16"), ("mutant_acc_fp16", "float16"),
                                        ("mutant_pv_low_precision", "bfloat16"),
                                        ("mutant_pv_low_precision", "float16")])
def test_exact_mean_catches_a_running_state_rounded_by_a_wide_margin(name, dtype):
    """On exact_mean values the reference is exact, so one rounding too many is several times its
    bound (on other values 1.0-1.4x), and the real kernel stays exact."""
    from fuzzattn.cli.mutants import catching
    the_case = case(20, 70, 32, batch=2, heads=4, kv_heads=2, causal="top_left",
                    values="exact_mean", dtype=dtype, data_seed=0)
    real = judge(implementations()["torch_tiled"], the_case, margins=True)
    assert real.passed and {v.check: v.error for v in real.verdicts}["out"] == 0.0
    caught = catching(judge(mutants()[name], the_case))
    assert caught.check == "out_rms" and caught.error > 3 * caught.allowed, caught


def test_a_kill_is_reported_by_the_check_furthest_past_its_bound():
    """A case failing out by a hair and out_rms by a mile is not one tolerance change from
    passing: the table names out_rms, and a check without a bound (non-finite values) before
    either."""
    from fuzzattn.cli.mutants import catching, margin
    from fuzzattn.judgement.judge import JudgedCase
    from fuzzattn.judging.verdict import Verdict

    def verdict(check, error=None, allowed=None):
        return Verdict(impl="m", case=case(), check=check, passed=False, error=error,
                       allowed=allowed)

    judged = JudgedCase("m", case(), [verdict("out", 1.05, 1.0), verdict("out_rms", 9.0, 2.0)])
    assert judged.first_failure.check == "out"
    assert catching(judged).check == "out_rms" and margin(catching(judged)) == "4.5x"
    judged.verdicts.append(verdict("nonfinite"))
    assert catching(judged).check == "nonfinite" and margin(catching(judged)) == "-"


def test_an_edit_must_match_exactly_once():
    assert apply_edits("a = 1\nb = 2\n", [("b = 2", "b = 3")], "m") == "a = 1\nb = 3\n"
    with pytest.raises(EditError, match="occurs 0 times"):
        apply_edits("a = 1\n", [("b = 2", "b = 3")], "mutant_x")
    with pytest.raises(EditError, match="occurs 2 times"):
        apply_edits("a = 1\na = 1\n", [("a = 1", "a = 2")], "mutant_x")


# -- small campaigns: the fuzzer finds these by itself ---------------------------------------------
@pytest.mark.parametrize("name", ["mutant_phantom_keys", "mutant_staging_buffer_aliasing",
                                  "mutant_empty_rows_mean_v", "mutant_nondeterministic"])
def test_a_small_campaign_kills_the_mutant(name):
    mutant = mutants()[name]
    profile = profiles.PROFILES["ci"]
    # One dtype's campaign, as `fuzzattn mutants` runs them (these bugs show in every dtype).
    result = fuzz(mutant, attention_cases(mutant.caps, dtype="float32", profile=profile),
                  max_examples=25, save_to_file=False)
    assert result.counterexample is not None, f"{name} survived {result.cases} cases"


_MEMO: dict = {}


def _shape_cached(q, k, v, *, causal, scale):
    key = (tuple(q.shape), tuple(k.shape), q.dtype, causal, scale)
    if key not in _MEMO:
        _MEMO[key] = sdpa_forward(q, k, v, causal=causal, scale=scale)
    out, lse = _MEMO[key]
    return out.clone(), lse.clone()


def test_a_result_cache_keyed_by_shape_is_caught_across_cases():
    """Results memoised by shape are right the first time a shape is seen and on a rerun of the
    same case, so no single case (and no fixture) can show the bug: only a later case with the
    same shape and other values can. It is therefore not in the zoo, which ships a fixture per
    mutant; this campaign shows the fuzzer still catches it, across cases."""
    _MEMO.clear()
    # Forward only: its memoised output is detached from autograd, so a gradient check would
    # catch it on the very first case, for another reason than the one this test is about.
    caps = dataclasses.replace(SDPA.caps, backward=False)
    cached = Implementation("shape_cached", _shape_cached, caps, mutant_of="sdpa",
                            description="returns the result memoised for the first case of a shape")
    result = fuzz(cached, attention_cases(cached.caps, profile=profiles.PROFILES["ci"]),
                  max_examples=30, save_to_file=False)
    assert result.counterexample is not None, f"survived {result.cases} cases"
    assert result.cases_to_first_failure > 1


# -- the kill table under several profiles ------------------------------------------------------
def _doubled(q, k, v, *, causal, scale):
    out, lse = sdpa_forward(q, k, v, causal=causal, scale=scale)
    return out * 2, lse


def test_the_kill_table_reports_cases_to_kill_under_each_profile(capsys, monkeypatch):
    """`--profiles dev,ci` runs the zoo under each profile and puts their cases to kill side by
    side, with a mutation score and kill speed per profile; exit 0 only if every one is killed."""
    import fuzzattn.run.registry
    from fuzzattn.cli import main
    from fuzzattn.contract import Capabilities
    caps = Capabilities(dtypes={"float32"})
    zoo = {"mutant_doubled": Implementation(name="mutant_doubled", fn=_doubled, caps=caps,
                                            description="doubles the output", mutant_of="sdpa"),
           "mutant_harmless": Implementation(name="mutant_harmless", fn=sdpa_forward, caps=caps,
                                             description="changes nothing", mutant_of="sdpa")}
    monkeypatch.setattr(fuzzattn.run.registry, "mutants", lambda: zoo)
    status = main(["mutants", "--profiles", "dev,ci", "--max-examples", "4"])
    out = capsys.readouterr().out
    assert status == 1, out                                   # mutant_harmless survives both
    assert "profile=dev" in out and "profile=ci" in out
    table = out[out.index("cases to kill by profile:"):].splitlines()
    assert table[1].split() == ["mutant", "dev", "ci"]
    doubled = next(line for line in table if line.startswith("mutant_doubled"))
    assert doubled.split()[1:] == ["1", "(fp32)", "1", "(fp32)"]
    assert "SURVIVED" in next(line for line in table if line.startswith("mutant_harmless"))
    assert "dev: mutation score: 1/2" in out and "ci: mutation score: 1/2" in out
    assert main(["mutants", "--profiles", "dev,nope"]) == 2
    assert "--profiles 'dev,nope': each must be one of ci, dev, gpu, nightly" in capsys.readouterr().err
