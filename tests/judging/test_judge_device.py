"""Where a judgement computes (fuzzattn/judging/placement.py): small cases on an accelerator are
judged on the host, large ones on the device, CPU cases on the CPU; larger cases with small
outputs half and half (references on the device, checks on the host); the overrides are checked."""
from __future__ import annotations

import pytest
import torch

from fuzzattn import AttentionCase
from fuzzattn.judgement import judge as judge_module
from fuzzattn.judgement import value_checks
from fuzzattn.gradients.reference_gradients import oracle_gradients
from fuzzattn.inputs.materialize import materialize, materialize_dout
from fuzzattn.judging.placement import (CHECK_ENV, ENV, HOST_CHECK_ELEMENTS, HOST_JUDGE_MACS,
                                          check_device, judge_device, moved, moved_together)
from fuzzattn.judging.oracle import oracle
from fuzzattn.run.registry import implementations

SMALL = AttentionCase(1, 2, 2, 16, 32, 64)                # 65,536 multiply-adds
LARGE = AttentionCase(4, 16, 4, 300, 300, 128)            # 737,280,000


def test_cpu_cases_are_judged_on_the_cpu_whatever_their_size():
    assert judge_device(LARGE, "cpu") == torch.device("cpu")


def test_small_accelerator_cases_are_judged_on_the_host_large_ones_on_the_device(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    # A device torch.device accepts without it being present: nothing is allocated on it.
    assert judge_device(SMALL, "cuda") == torch.device("cpu")
    assert judge_device(LARGE, "cuda") == torch.device("cuda")
    edge = AttentionCase(1, 1, 1, 1, HOST_JUDGE_MACS // 64, 64)
    assert judge_device(edge, "cuda") == torch.device("cpu")
    assert judge_device(edge.replace(seq_q=2), "cuda") == torch.device("cuda")
    # No keys still costs the oracle a pass over the queries: counted as one key.
    assert judge_device(SMALL.replace(seq_k=0), "cuda") == torch.device("cpu")


def test_the_override(monkeypatch):
    monkeypatch.setenv(ENV, "0")
    assert judge_device(SMALL, "cuda") == torch.device("cuda")
    monkeypatch.setenv(ENV, str(10 ** 12))
    assert judge_device(LARGE, "cuda") == torch.device("cpu")
    for bad in ("many", "-1"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=f"{ENV}='{bad}'"):
            judge_device(SMALL, "cuda")


def test_moved_keeps_values_and_none():
    t = torch.arange(6.0).reshape(2, 3).t()
    assert moved(t, torch.device("cpu")) is t
    assert moved(None, torch.device("cpu")) is None


# B * Hq * max(Nq, Nk) * D = 2 * 4 * 300 * 32 = 76,800 elements; 23,040,000 multiply-adds.
MIDDLE = AttentionCase(2, 4, 2, 300, 300, 32)


def test_larger_cases_with_small_outputs_are_checked_on_the_host(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(CHECK_ENV, raising=False)
    assert judge_device(MIDDLE, "cuda") == torch.device("cuda")
    assert check_device(MIDDLE, "cuda") == torch.device("cpu")
    assert check_device(LARGE, "cuda") == torch.device("cuda")
    assert check_device(SMALL, "cuda") == torch.device("cpu")        # references there too
    assert check_device(LARGE, "cpu") == torch.device("cpu")
    # The longer of Nq and Nk counts: dk and dv have Nk rows.
    edge = AttentionCase(1, 1, 1, 1, HOST_CHECK_ELEMENTS, 1).replace(seq_q=2 ** 12)
    assert judge_device(edge, "cuda") == torch.device("cuda")
    assert check_device(edge, "cuda") == torch.device("cpu")
    assert check_device(edge.replace(seq_k=HOST_CHECK_ELEMENTS + 1), "cuda") == torch.device("cuda")
    monkeypatch.setenv(CHECK_ENV, "0")
    assert check_device(MIDDLE, "cuda") == torch.device("cuda")
    monkeypatch.setenv(CHECK_ENV, "lots")
    with pytest.raises(ValueError, match=f"{CHECK_ENV}='lots'"):
        check_device(MIDDLE, "cuda")


def test_moved_together_keeps_every_tensor_and_reads_deferred_magnitudes():
    case = AttentionCase(1, 2, 1, 5, 7, 8, causal="bottom_right")
    q, k, v = materialize(case).tensors()
    deferred = oracle(q, k, v, case, deferred=True)
    assert isinstance(deferred.score_magnitude, torch.Tensor) and deferred.score_magnitude.dim() == 0
    read, = moved_together([deferred], torch.device("cpu"))
    plain = oracle(q, k, v, case)
    assert read.score_magnitude == plain.score_magnitude and isinstance(read.score_magnitude, float)
    for name in ("out", "lse", "empty_rows", "out_magnitude"):
        assert torch.equal(getattr(read, name), getattr(plain, name)), name
    _, dout = materialize_dout(case)
    grads, = moved_together([oracle_gradients(q, k, v, dout, case, deferred=True)], torch.device("cpu"))
    expected = oracle_gradients(q, k, v, dout, case)
    assert grads.score_magnitude == expected.score_magnitude
    for name in ("dq", "dk", "dv"):
        assert torch.equal(grads.grads[name], expected.grads[name])
        for part in ("actual", "magnitude", "delta"):
            assert torch.equal(getattr(grads.terms[name], part), getattr(expected.terms[name], part))


def test_references_are_read_back_once_from_elsewhere_and_not_at_all_from_here(monkeypatch):
    """References computed where the checks compute (the host, for a CPU run) are not deferred
    and read nothing back: the oracle's score magnitude is a float at once. Computed elsewhere
    (on the GPU for a case checked on the host: half-and-half), they are deferred and read back
    in one call of moved_together per judgement (forward, then gradients), the score magnitude a
    0-d tensor until then. The forward's come back in the runs' own read-back
    (judge._read_back_with_references), the gradients' in one call of moved_together."""
    seen, magnitudes, also = [], [], []

    def spying(references, device):
        seen.append([type(r.score_magnitude) for r in references])
        return moved_together(references, device)

    deliver = judge_module.runs.deliver

    def deliver_spy(impl, case, runs, also_tensors=()):
        also.append([tuple(t.shape) for t in also_tensors])
        return deliver(impl, case, runs, also=also_tensors)

    def oracle_spy(*args, **kwargs):
        ref = oracle(*args, **kwargs)
        magnitudes.append(type(ref.score_magnitude))
        return ref

    monkeypatch.setattr(judge_module, "moved_together", spying)
    monkeypatch.setattr("fuzzattn.gradients.gradient_verdicts.moved_together", spying)
    monkeypatch.setattr(judge_module, "oracle", oracle_spy)
    monkeypatch.setattr(judge_module.runs, "deliver",
                        lambda impl, case, runs, also=(): deliver_spy(impl, case, runs, also))
    judged = judge_module.judge(implementations()["sdpa"], MIDDLE.replace(seq_q=9, seq_k=11), "cpu")
    assert judged.passed, judged.describe()
    assert seen == [] and magnitudes == [float] and also == [[], []]   # each run its own
    if torch.cuda.is_available():
        monkeypatch.delenv(CHECK_ENV, raising=False)
        assert check_device(MIDDLE, "cuda").type == "cpu" and judge_device(MIDDLE, "cuda").type == "cuda"
        also.clear()
        judged = judge_module.judge(implementations()["sdpa_math"], MIDDLE, "cuda")
        assert judged.passed, judged.describe()
        assert len(also) == 1 and () in also[0]   # one read-back: both runs, the references and
        assert magnitudes[-1] is torch.Tensor     # the oracle's deferred (0-d) score magnitude
        assert len(seen) == 1 and seen[0][0] is torch.Tensor    # the gradients' references


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: references on the device")
def test_half_and_half_gives_the_verdicts_of_judging_on_the_device(monkeypatch):
    impl = implementations()["sdpa_math"]
    for case in (MIDDLE, MIDDLE.replace(causal="bottom_right", seq_q=280, dtype="bfloat16")):
        monkeypatch.delenv(CHECK_ENV, raising=False)
        assert check_device(case, "cuda").type == "cpu" and judge_device(case, "cuda").type == "cuda"
        half = judge_module.judge(impl, case, "cuda")
        monkeypatch.setenv(CHECK_ENV, "0")
        whole = judge_module.judge(impl, case, "cuda")
        assert [(v.check, v.passed) for v in half.verdicts] == [(v.check, v.passed) for v in whole.verdicts]
        for a, b in zip(half.verdicts, whole.verdicts):
            if a.error is not None:        # float64 on two devices: equal to rounding
                assert a.error == pytest.approx(b.error, rel=1e-9, abs=1e-300), a.check
                assert a.allowed == pytest.approx(b.allowed, rel=1e-9), a.check


def _launched(impl, case):
    pristine = materialize(case, "cpu")
    first = judge_module.runs.launch(impl, case, "cpu", adversarial=True, inputs=pristine.copy(),
                                     pristine=pristine, here=torch.device("cpu"))
    return pristine, first


def test_references_read_back_with_the_runs_give_the_same_verdicts():
    """Half and half (`_read_back_with_references`: on a GPU, references on the device and
    checks on the host), run here on the CPU: both runs and the deferred references come back
    in one read-back, and judging them gives exactly the verdicts of the usual order."""
    impl = implementations()["sdpa"]
    for case in (MIDDLE.replace(seq_q=9, seq_k=11), MIDDLE.replace(causal="bottom_right", seq_q=13,
                                                                    seq_k=6, dtype="bfloat16")):
        cpu = torch.device("cpu")
        pristine, first = _launched(impl, case)
        second, computed = judge_module._read_back_with_references(impl, case, "cpu", first,
                                                                   pristine, cpu, cpu)
        assert second is not None and second.delivered is not None and first.delivered is not None
        assert isinstance(computed[0].score_magnitude, float)      # read with the runs
        verdicts, _ = judge_module._judge_runs(impl, case, "cpu", first, pristine, cpu, second,
                                               references=cpu, computed=computed)
        usual = judge_module.judge(impl, case, "cpu", gradients=False).verdicts
        assert [(v.check, v.passed, v.error, v.allowed) for v in verdicts] == \
               [(v.check, v.passed, v.error, v.allowed) for v in usual]


def test_a_context_the_first_run_faulted_is_its_crash_and_a_harness_error_is_raised(monkeypatch):
    impl = implementations()["sdpa"]
    case = MIDDLE.replace(seq_q=9, seq_k=11)
    cpu = torch.device("cpu")
    runs = judge_module.runs

    def refused(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    # A faulted context: every launch after the first run fails, and so does its read-back.
    pristine, first = _launched(impl, case)
    monkeypatch.setattr(judge_module, "oracle", refused)
    monkeypatch.setattr(runs, "read_back", refused)
    assert judge_module._read_back_with_references(impl, case, "cpu", first, pristine, cpu,
                                                   cpu) == (None, None)
    assert first.failure.check == "crash" and "illegal memory access" in first.failure.detail
    # A healthy device: the references' own error is the harness's, and is raised.
    monkeypatch.undo()
    monkeypatch.setattr(judge_module, "oracle", refused)
    pristine, first = _launched(impl, case)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        judge_module._read_back_with_references(impl, case, "cpu", first, pristine, cpu, cpu)
    assert first.failure is None and first.delivered is not None


@pytest.mark.parametrize("case", [
    MIDDLE.replace(seq_q=40, seq_k=24),
    MIDDLE.replace(seq_q=40, seq_k=24, causal="bottom_right", dtype="bfloat16"),   # empty rows
    MIDDLE.replace(seq_q=9, seq_k=0),                                              # no key at all
], ids=str)
def test_value_checks_read_their_scalars_once_and_a_deferred_magnitude_judges_the_same(
        monkeypatch, case):
    """value_verdicts reads every scalar of the max rules in one call of tolerance.maxima (one
    wait on an accelerator: both bounds' maxima, the non-finite rows, and the oracle's score
    magnitude when it is still a 0-d tensor, as it is on a device; whether any row is empty is
    known from the lengths). On the CPU the deferred magnitude is a 0-d CPU tensor: the same
    verdicts, to the bit, as the float."""
    impl = implementations()["sdpa"]
    pristine, first = _launched(impl, case)
    judge_module.runs.deliver(impl, case, [first])
    spr = judge_module.same_precision_reference(*pristine.tensors(), case, magnitudes=False)
    calls = []
    real = value_checks.maxima

    def counting(*tensors):
        calls.append(len(tensors))
        return real(*tensors)

    monkeypatch.setattr(value_checks, "maxima", counting)
    results = []
    for deferred in (False, True):
        ref = oracle(*pristine.tensors(), case, deferred=deferred)
        assert isinstance(ref.score_magnitude, torch.Tensor) == (deferred and case.seq_k > 0)
        calls.clear()
        verdicts, nonfinite = value_checks.value_verdicts(impl, case, first, ref, spr)
        results.append([(v.check, v.passed, v.error, v.allowed) for v in verdicts])
        assert nonfinite is None
        # one read: 3 maxima a bound (out, lse), the NaN test of the lse entries the oracle
        # leaves out (-inf: rows with no key), the magnitude if deferred (none without keys:
        # then it is 0.0 at once)
        left_out = not bool(torch.isfinite(ref.lse).all())
        assert left_out == (case.causal == "bottom_right" or case.seq_k == 0) == ref.some_empty
        assert calls == [6 + left_out + (deferred and case.seq_k > 0)]
    assert results[0] == results[1] and all(passed for _, passed, _, _ in results[0])


@pytest.mark.parametrize("case", [
    MIDDLE.replace(seq_q=12, seq_k=7, head_dim=8),
    MIDDLE.replace(seq_q=12, seq_k=7, head_dim=8, causal="bottom_right", dtype="float16"),
    MIDDLE.replace(seq_q=5, seq_k=0, head_dim=8),
], ids=str)
def test_nonfinite_rows_found_from_the_maxima_are_the_rows_a_pass_of_their_own_finds(case):
    """value_verdicts computes the non-finite rows only when the max rules' worst error is
    infinite, or an lse the oracle leaves out (-inf: no key) is NaN; NaN and inf placed anywhere
    in out or lse, one entry at a time, give exactly nonfinite_rows' rows."""
    impl = implementations()["sdpa"]
    pristine, first = _launched(impl, case)
    judge_module.runs.deliver(impl, case, [first])
    ref = oracle(*pristine.tensors(), case)
    spr = judge_module.same_precision_reference(*pristine.tensors(), case, magnitudes=False)
    out, lse = first.delivered[1:]
    generator = torch.Generator().manual_seed(0)
    spoiled = [(None, None, None)]
    for name, tensor in (("out", out), ("lse", lse)):
        for value in (float("nan"), float("inf"), float("-inf")):
            for _ in range(4):
                spoiled.append((name, int(torch.randint(tensor.numel(), (1,), generator=generator)),
                                value))
    checked = 0
    for name, index, value in spoiled:
        got_out, got_lse = out.clone(), lse.clone()
        if name is not None:
            (got_out if name == "out" else got_lse).view(-1)[index] = value
        run = judge_module.dataclasses.replace(
            first, call=judge_module.dataclasses.replace(first.call, out=got_out, lse=got_lse),
            delivered=None)
        with torch.inference_mode():
            _, found = value_checks.value_verdicts(impl, case, run, ref, spr)
            expected = value_checks.nonfinite_rows(run, ref)
        expected = None if expected is None or not bool(expected.any()) else expected
        if expected is None:
            assert found is None or not bool(found.any()), (name, index, value)
        else:
            checked += 1
            assert found is not None and torch.equal(found, expected), (name, index, value)
    # -inf in an lse of a row with no key is its convention, not a non-finite row
    assert checked >= (12 if case.seq_k else 4)
