"""What real third-party kernels need from the fuzzer: length constraints, configuration spaces,
verdicts for kernels whose answer changes between calls and for kernels that do not compile, and
refusals that are counted rather than passed."""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings

from fuzzattn import AttentionCase, Capabilities, Implementation
from fuzzattn.campaigns.campaign import fuzz, judge_once
from fuzzattn.campaigns.regression_file import load
from fuzzattn.campaigns.file_replay import replay_one
from fuzzattn.contract import profiles
from fuzzattn.run.execute import LOG_DIR
from fuzzattn.judgement.judge import judge
from fuzzattn.kernels.sdpa import sdpa_forward
from fuzzattn.strategies import attention_cases, undeclared_cases

CI = profiles.PROFILES["ci"]


def exact(q, k, v, *, causal, scale, config=None):
    return sdpa_forward(q, k, v, causal=causal, scale=scale)


# -- length constraints ---------------------------------------------------------------------------
SQUARE_64 = Capabilities(dtypes={"float32"}, head_dims={16}, equal_lengths=True, seq_multiple=64,
                         min_seq_len=64, causal=())


@settings(max_examples=30, database=None)
@given(attention_cases(SQUARE_64, profile=CI))
def test_strategies_draw_inside_length_constraints_directly(case):
    assert case.seq_q == case.seq_k and case.seq_q % 64 == 0 and case.seq_q >= 64


@settings(max_examples=30, database=None)
@given(undeclared_cases(SQUARE_64, profile=CI))
def test_the_refusal_property_draws_just_outside_them(pair):
    what, case = pair
    assert SQUARE_64.why_not(case) is not None
    if what == "equal lengths":
        assert case.seq_k == case.seq_q + 1
    if what == "length multiple":
        assert case.seq_k % 64 == 1


SQUARE_CAUSAL = Capabilities(dtypes={"float32"}, head_dims={16}, causal=("top_left",),
                             causal_equal_lengths=True)


@settings(max_examples=60, database=None)
@given(attention_cases(SQUARE_CAUSAL, profile=CI))
def test_causal_cases_are_drawn_square_where_only_those_are_declared(case):
    """FLASH through SDPA on CUDA: is_causal with Nq != Nk raises, non-causal runs any lengths."""
    assert SQUARE_CAUSAL.why_not(case) is None
    if case.causal != "none":
        assert case.seq_q == case.seq_k


def test_a_non_square_causal_case_is_outside_such_a_declaration():
    case = AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=3, seq_k=5, head_dim=16,
                         causal="top_left")
    assert SQUARE_CAUSAL.why_not(case) == "causal=top_left with seq_q=3 != seq_k=5"
    assert SQUARE_CAUSAL.why_not(case.replace(causal="none")) is None
    assert SQUARE_CAUSAL.why_not(case.replace(seq_k=3)) is None


@settings(max_examples=30, database=None)
@given(undeclared_cases(SQUARE_CAUSAL, profile=CI))
def test_the_refusal_property_draws_non_square_causal_cases_for_it(pair):
    what, case = pair
    assert SQUARE_CAUSAL.why_not(case) is not None
    if what == "causal lengths":
        assert case.causal == "top_left" and case.seq_k == case.seq_q + 1


def test_check_inputs_refuses_lengths_outside_the_declaration():
    q = torch.zeros(1, 1, 64, 16)
    k = torch.zeros(1, 1, 65, 16)
    with pytest.raises(ValueError, match="lengths"):
        SQUARE_64.check_inputs(q, k, k, causal=False, scale=1.0)


# -- configuration spaces ---------------------------------------------------------------------------
def _tile_rule(config, case):
    return "BLOCK_N > head_dim" if config["BLOCK_N"] > 2 * case.head_dim else None


def _wrong_when_blocks_differ(q, k, v, *, causal, scale, config):
    out, lse = sdpa_forward(q, k, v, causal=causal, scale=scale)
    if config["BLOCK_M"] != config["BLOCK_N"]:       # a configuration-only bug
        out = out * 1.5
    return out, lse


TILED = Implementation("tiled_config_bug", _wrong_when_blocks_differ, Capabilities(
    dtypes={"float32"}, head_dims={16, 32}, causal=(),
    configs={"BLOCK_M": (16, 32, 64), "BLOCK_N": (16, 32, 64)}, config_rule=_tile_rule))


@settings(max_examples=40, database=None)
@given(attention_cases(TILED.caps, profile=CI))
def test_configurations_are_drawn_within_the_rule(case):
    config = case.config_dict
    assert set(config) == {"BLOCK_M", "BLOCK_N"} and config["BLOCK_N"] <= 2 * case.head_dim


def test_a_configuration_bug_is_found_shrunk_recorded_and_replayed_pinned(tmp_path):
    result = fuzz(TILED, attention_cases(TILED.caps, profile=CI), max_examples=60,
                  regressions_dir=tmp_path)
    found = result.counterexample
    assert found is not None
    # shrinking moves each axis toward its first choice: the smallest failing configuration
    assert found.judged.case.config_dict == {"BLOCK_M": 16, "BLOCK_N": 32}
    assert "config=BLOCK_M:16,BLOCK_N:32" in str(found)
    record = load(found.path)
    assert record.case.config_dict == {"BLOCK_M": 16, "BLOCK_N": 32}
    assert replay_one(record, TILED).verdict == "FAIL"
    fixed = Implementation("fixed", exact, TILED.caps)
    assert replay_one(record, fixed).verdict == "ok"


# -- a result that changes between runs ----------------------------------------------------------
class FirstCallPerShapeIsWrong:
    """Like an autotuner whose first call per size key benchmarks configurations and returns the
    answer of a broken one: wrong once per shape, right afterwards."""

    def __init__(self):
        self.seen = set()

    def __call__(self, q, k, v, *, causal, scale):
        out, lse = sdpa_forward(q, k, v, causal=causal, scale=scale)
        key = tuple(q.shape) + tuple(k.shape)
        if key not in self.seen:
            self.seen.add(key)
            out = out + 1.0
        return out, lse


def test_a_result_that_changes_between_runs_is_a_flaky_verdict_not_a_hypothesis_error(tmp_path):
    impl = Implementation("autotuned_first_call", FirstCallPerShapeIsWrong(),
                          Capabilities(dtypes={"float32"}, causal=()))
    result = fuzz(impl, attention_cases(impl.caps, profile=CI), max_examples=30,
                  regressions_dir=tmp_path)
    assert result.error is None, result.error              # no FlakyFailure surfaced
    found = result.counterexample
    assert found is not None and found.judged.first_failure.check == "flaky"
    assert "failed in 1 of 3 runs" in found.judged.first_failure.detail
    record = load(found.path)
    assert record.check == "flaky"
    replayed = replay_one(record, Implementation("again", FirstCallPerShapeIsWrong(), impl.caps))
    assert replayed.verdict == "FAIL" and "failed in 1 of 5 replays" in replayed.message


def test_a_verdict_is_remembered_per_case():
    calls = []

    def counting(q, k, v, *, causal, scale):
        calls.append(1)
        return sdpa_forward(q, k, v, causal=causal, scale=scale)

    impl = Implementation("counting", counting, Capabilities(dtypes={"float32"}))
    case = AttentionCase(1, 1, 1, 3, 3, 16)
    judge_once(impl, case)
    n = len(calls)
    judge_once(impl, case)
    assert len(calls) == n


# -- a kernel that does not compile ---------------------------------------------------------------
class CompilationError(Exception):
    """Named like Triton's: the engine recognises compile errors by type and text."""


def _does_not_compile(q, k, v, *, causal, scale):
    for i in range(300):              # what an MLIR pass failure prints, below Python
        os.write(2, f"module @fa2_fwd {{ tt.func ... line {i} }}\n".encode())
    raise CompilationError("at 12:8:\nerror: 'tt.dot' op expected operands of the same type\n"
                           "    acc = tl.dot(p, v, acc)\n")


def test_a_compile_error_is_one_line_and_the_compiler_output_goes_to_a_log(capfd):
    impl = Implementation("no_compile", _does_not_compile, Capabilities(dtypes={"float32"}))
    case = AttentionCase(1, 1, 1, 4, 4, 16)
    judged = judge(impl, case)
    failure = judged.first_failure
    assert failure.check == "crash" and "\n" not in failure.detail
    assert failure.detail.startswith("compile error: CompilationError: error: 'tt.dot' op")
    log = failure.detail.rsplit("compiler output: ", 1)[1].rstrip(")")
    text = open(log).read()
    assert log.startswith(str(LOG_DIR)) and "line 299" in text and "tl.dot(p, v, acc)" in text
    captured = capfd.readouterr()
    assert "tt.func" not in captured.err and "tt.func" not in captured.out   # no flood


class PTXASError(RuntimeError):
    """Named as Triton's: ptxas (the CUDA assembler) failed."""


def test_an_assembler_crash_is_a_compile_error_and_its_stdout_dump_goes_to_the_log(capfd):
    """Triton prints a failed ptxas run's whole PTX to stdout, then raises PTXASError (seen on
    the H200: ptxas crashed with error code -11 on one triton_fa2 configuration)."""
    def assembler_crash(q, k, v, *, causal, scale):
        print("// Generated by LLVM NVPTX Back-End\n.visible .entry fa2_fwd_kernel(", flush=True)
        raise PTXASError("PTXAS error: `ptxas` failed with error code -11")

    judged = judge(Implementation("asm_crash", assembler_crash, Capabilities(dtypes={"float32"})),
                   AttentionCase(1, 1, 1, 4, 4, 16))
    failure = judged.first_failure
    assert failure.check == "crash" and "\n" not in failure.detail
    assert failure.detail.startswith("compile error: PTXASError: PTXAS error: `ptxas` failed")
    log = failure.detail.rsplit("compiler output: ", 1)[1].rstrip(")")
    assert ".visible .entry fa2_fwd_kernel(" in open(log).read()
    captured = capfd.readouterr()
    assert "NVPTX" not in captured.out and "NVPTX" not in captured.err       # no flood


def test_a_kernel_that_prints_and_works_keeps_its_output(capfd):
    def chatty(q, k, v, *, causal, scale):
        os.write(2, b"kernel says hello\n")
        return sdpa_forward(q, k, v, causal=causal, scale=scale)

    judged = judge(Implementation("chatty", chatty, Capabilities(dtypes={"float32"})),
                   AttentionCase(1, 1, 1, 4, 4, 16))
    assert judged.passed
    assert "kernel says hello" in capfd.readouterr().err


# -- refusals that count -----------------------------------------------------------------------------
def _no_kernel_for_odd_lengths(q, k, v, *, causal, scale):
    if q.shape[2] % 2:
        raise RuntimeError("No available kernel. Aborting execution.")
    return sdpa_forward(q, k, v, causal=causal, scale=scale)


def test_declared_refusals_are_counted_and_never_passes():
    impl = Implementation("picky", _no_kernel_for_odd_lengths,
                          Capabilities(dtypes={"float32"}, refusals=("No available kernel",)))
    judged = judge(impl, AttentionCase(1, 1, 1, 3, 4, 16))
    assert judged.refused and not judged.passed and not judged.failures
    result = fuzz(impl, attention_cases(impl.caps, profile=CI), max_examples=40, save_to_file=False)
    assert result.passed and result.cases >= 1
    assert result.refused_total >= 1
    note = result.refusal_note()
    assert "% of draws refused: RuntimeError: No available kernel" in note


def test_an_undeclared_refusal_of_a_declared_case_is_a_crash():
    impl = Implementation("picky_undeclared", _no_kernel_for_odd_lengths,
                          Capabilities(dtypes={"float32"}))
    judged = judge(impl, AttentionCase(1, 1, 1, 3, 4, 16))
    assert judged.first_failure.check == "crash"


# -- the README's example: a real-shaped kernel fuzzed from its own file ----------------------------
def test_the_example_kernel_is_fuzzed_from_its_file_and_its_configuration_bug_found(tmp_path, capsys):
    from pathlib import Path

    from fuzzattn import cli
    example = Path(__file__).resolve().parents[2] / "examples" / "square_fp16_attention.py"
    status = cli.main(["fuzz", "--impl", f"{example}:SQUARE_FP16", "--max-examples", "12",
                       "--regressions-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 1, out
    # one file per distinct defect: the one bug may be reported once per configuration axis it
    # needs off its first choice (BLOCK_N=32 with BLOCK_M first, BLOCK_M=32 with BLOCK_N first)
    written = sorted(tmp_path.glob("*.json"))
    assert 1 <= len(written) <= 2, out
    for path in written:
        case = load(path).case
        assert case.config_dict["BLOCK_M"] != case.config_dict["BLOCK_N"]   # the only trigger
        assert case.seq_q == case.seq_k and case.seq_q % 64 == 0 and case.dtype == "float16"
    assert f"--impl {example}:SQUARE_FP16" in out
