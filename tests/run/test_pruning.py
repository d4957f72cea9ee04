"""Triton's autotuner semantics for declared configuration spaces (fuzzattn/run/pruning.py): a
configuration that fails to compile for a case with an error the autotuner skips is pruned and
counted, never a counterexample; no configuration compiling is a finding; other compile errors
stay crashes; a declaration can opt out."""
from __future__ import annotations

from pathlib import Path

import pytest
from triton.compiler.errors import CompilationError, CompileTimeAssertionFailure
from triton.runtime.errors import OutOfResources, PTXASError

from fuzzattn import AttentionCase, cli
from fuzzattn.campaigns.campaign import fuzz
from fuzzattn.campaigns.pruned import pruned_lines
from fuzzattn.judgement.judge import default_device, judge
from fuzzattn.inputs.materialize import materialize
from fuzzattn.run import execute, pruning
from fuzzattn.strategies.cases import attention_cases

import pruning_kernels as pk

KERNELS = Path(__file__).resolve().parents[1] / "pruning_kernels.py"


@pytest.fixture(autouse=True)
def _fresh_compile_memory(monkeypatch):
    monkeypatch.setattr(pruning, "_compiles", {})


def case(head_dim=16, **config) -> AttentionCase:
    return AttentionCase(1, 1, 1, 4, 4, head_dim, config=tuple(sorted(config.items())))


def test_exactly_the_errors_the_autotuner_skips_are_recognised():
    assert pruning.autotuner_skips(OutOfResources(278592, 232448, "shared memory")).startswith(
        "OutOfResources: out of resource: shared memory")
    assert pruning.autotuner_skips(PTXASError("ptxas died")).startswith("PTXASError")
    assert pruning.autotuner_skips(CompileTimeAssertionFailure("src", None, "no")).startswith(
        "CompileTimeAssertionFailure")
    assert pruning.autotuner_skips(CompilationError("src", None, "internal error")) == ""
    assert pruning.autotuner_skips(RuntimeError("out of resource: shared memory")) == ""
    assert pruning.autotuner_skips(AssertionError("BLOCK must not exceed the head dim")) == ""


def test_a_failed_static_assert_is_a_compile_time_assertion_with_its_message():
    q, k, v = materialize(case(BLOCK=32), default_device()).tensors()     # compiled on a GPU
    call = execute.call(pk.STATIC_ASSERT, q, k, v, case(BLOCK=32))
    assert call.status == execute.CRASH
    assert call.autotuner_skips == ("CompileTimeAssertionFailure: BLOCK must not exceed the "
                                    "head dim")
    ok = execute.call(pk.STATIC_ASSERT, q, k, v, case(BLOCK=16))
    assert ok.answered and ok.autotuner_skips == ""


def test_a_pruned_configuration_is_neither_a_pass_nor_a_failure():
    judged = judge(pk.STATIC_ASSERT, case(BLOCK=64))
    assert judged.refused.startswith(f"{pruning.PRUNED_PREFIX}: CompileTimeAssertionFailure")
    assert not judged.passed and judged.failures == []
    assert judge(pk.STATIC_ASSERT, case(BLOCK=16)).passed


def test_no_configuration_compiling_is_a_finding_naming_each():
    judged = judge(pk.NONE_COMPILES, case(BLOCK=32))
    first = judged.first_failure
    assert first.check == "no_configuration_compiles"
    assert "none of the 2 declared configurations compiles for D=16 float32" in first.detail
    assert "BLOCK=32: CompileTimeAssertionFailure" in first.detail
    assert "BLOCK=64: CompileTimeAssertionFailure" in first.detail
    assert judge(pk.NONE_COMPILES, case(32, BLOCK=32)).passed     # D=32: BLOCK=32 compiles


def test_other_compile_errors_and_an_opted_out_declaration_stay_crashes():
    internal = judge(pk.RAISING, case(32, STAGES=2)).first_failure
    assert internal.check == "crash" and "CompilationError" in internal.detail
    assert judge(pk.RAISING, case(64, STAGES=4)).refused.startswith(
        f"{pruning.PRUNED_PREFIX}: OutOfResources")
    assert judge(pk.RAISING, case(64, STAGES=3)).refused.startswith(
        f"{pruning.PRUNED_PREFIX}: PTXASError")
    opted_out = judge(pk.NOT_PRUNED, case(BLOCK=64))
    assert opted_out.refused is None
    assert opted_out.first_failure.check == "crash"
    assert "CompileTimeAssertionFailure" not in (opted_out.refused or "")


def test_autotune_declare_carries_the_opt_out():
    import triton
    from fuzzattn.contract.autotune import declare
    tuner = triton.autotune(configs=[triton.Config({"BLOCK": 16})], key=[])(pk._tile_check)
    assert declare(tuner)["prune_compile_errors"] is True
    assert declare(tuner, prune_compile_errors=False)["prune_compile_errors"] is False
    with pytest.raises(TypeError, match="prune_compile_errors='no'"):
        declare(tuner, prune_compile_errors="no")


def test_a_campaign_counts_pruned_draws_and_stops_judging_them(monkeypatch):
    calls = {}
    original = pk.STATIC_ASSERT.fn

    def counted(q, k, v, *, causal, scale, config):
        key = (config["BLOCK"], q.shape[-1])
        calls[key] = calls.get(key, 0) + 1
        return original(q, k, v, causal=causal, scale=scale, config=config)

    import dataclasses
    impl = dataclasses.replace(pk.STATIC_ASSERT, fn=counted)
    result = fuzz(impl, attention_cases(impl.caps), max_examples=40, save_to_file=False,
                  stop_at_first=False)
    assert result.passed and result.defects == [], result.counterexample
    assert result.pruned, "no draw of a configuration wider than D"
    for (config, error, case_class), draws in result.pruned.items():
        block, head_dim = int(config.split("=")[1]), int(case_class.split()[0][2:])
        assert error == "CompileTimeAssertionFailure" and block > head_dim
        # judged once for its own draw and at most once while another was checked: later
        # draws of the same combination are rejected unjudged (the first two calls of a
        # judged case: the adversarial run fails, nothing else runs)
        assert calls[(block, head_dim)] <= 2, calls
    lines = pruned_lines(result.pruned)
    assert any(line.startswith("CompileTimeAssertionFailure for D=") and "BLOCK=" in line
               for line in lines), lines
    assert "pruned" not in result.refusal_note()


def test_fuzz_command_reports_pruned_configurations_after_the_table(capsys, tmp_path):
    status = cli.main(["fuzz", "--impl", f"{KERNELS}:STATIC_ASSERT", "--max-examples", "30",
                       "--regressions-dir", str(tmp_path), "--profile", "dev"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "pruned (configurations that do not compile" in out
    assert ": CompileTimeAssertionFailure for D=" in out      # after the campaign's label
    assert not list(tmp_path.glob("*.json"))


def test_no_configuration_compiling_is_saved_and_replays(capsys, tmp_path):
    status = cli.main(["fuzz", "--impl", f"{KERNELS}:NONE_COMPILES", "--max-examples", "30",
                       "--regressions-dir", str(tmp_path), "--profile", "dev"])
    out = capsys.readouterr().out
    assert status == 1, out
    assert "no_configuration_compiles" in out
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1, out
    assert cli.main(["replay", str(files[0]), "--impl", f"{KERNELS}:NONE_COMPILES"]) == 1
    assert "no_configuration_compiles" in capsys.readouterr().out


def test_pruned_configurations_are_listed_once_per_error_and_case_class():
    pruned = {("BLOCK_M=16 BLOCK_N=64", "CompileTimeAssertionFailure", "D=32 float16"): 3,
              ("BLOCK_M=64 BLOCK_N=64", "CompileTimeAssertionFailure", "D=32 float16"): 2,
              ("BLOCK_M=128 BLOCK_N=64", "CompileTimeAssertionFailure", "D=32 float16"): 1,
              ("BLOCK_M=128 BLOCK_N=128", "OutOfResources", "D=128 float16"): 1}
    assert pruned_lines(pruned) == [
        "CompileTimeAssertionFailure for D=32 float16: 3 configurations "
        "(BLOCK_M=16|64|128 BLOCK_N=64), 6 draws",
        "OutOfResources for D=128 float16: BLOCK_M=128 BLOCK_N=128, 1 draw"]
