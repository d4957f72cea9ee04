"""Known upstream defects judged, not skipped (fuzzattn/contract/known_defects.py): a covered case
still runs; a failure of the defect's recorded check is tallied to it, any other failure on it
is a finding, a pass is a pass; a device fault is still passed over in-process, a backward's
by judging the forward alone."""
from __future__ import annotations

import dataclasses

import torch

from fuzzattn.contract import AttentionCase, KnownDefect
from fuzzattn.campaigns.campaign import fuzz, judge_once
from fuzzattn.contract.known_defects import KNOWN_PREFIX
from fuzzattn.judgement.judge import default_device, judge
from fuzzattn.kernels import sdpa
from fuzzattn.strategies.cases import attention_cases

import pruning_kernels as pk

HERE = torch.device(default_device()).type
NAN_ROWS = KnownDefect("no safe max: NaN rows where bottom-right leaves a row no key", HERE,
                       lambda case: case.causal == "bottom_right", "example.json",
                       check="nonfinite")
KNOWN = dataclasses.replace(pk.TWO_BUGS, name="two_bugs_one_known", caps=dataclasses.replace(
    pk.TWO_BUGS.caps, known_defects=(NAN_ROWS,)))


def br(seq_q, seq_k) -> AttentionCase:
    return AttentionCase(1, 1, 1, seq_q, seq_k, 16, causal="bottom_right")


def test_a_covered_case_fails_as_the_known_defect_and_is_tallied():
    judged = judge_once(KNOWN, br(2, 1), gradients=False)
    assert judged.refused == f"{KNOWN_PREFIX} hit (example.json): {NAN_ROWS.name}"
    assert "nonfinite" in {v.check for v in judged.failures}


def test_another_failure_on_a_covered_case_is_a_finding():
    judged = judge_once(KNOWN, br(2, 17), gradients=False)      # the chunk bug, not NaN rows
    assert judged.refused is None
    assert judged.first_failure.check == "out"


def test_a_covered_case_that_passes_is_a_pass():
    assert judge_once(KNOWN, br(4, 4), gradients=False).passed


def test_a_device_fault_or_an_unnamed_check_is_still_passed_over_unjudged():
    calls = []

    def never(q, k, v, *, causal, scale):
        calls.append(1)
        raise AssertionError("must not run")

    for check in ("device_fault", ""):
        defect = dataclasses.replace(NAN_ROWS, check=check)
        impl = dataclasses.replace(KNOWN, name=f"never_{check}", fn=never,
                                   caps=dataclasses.replace(KNOWN.caps, known_defects=(defect,)))
        assert judge_once(impl, br(2, 1), gradients=False).refused == defect.summary()
    assert calls == []


def test_a_case_also_covered_by_an_unjudgeable_defect_is_passed_over():
    """Two defects cover it, the first judged (out), the second a device fault: in one process
    the fault would poison every later case's CUDA context, so the case is not run."""
    calls = []

    def never(q, k, v, *, causal, scale):
        calls.append(1)
        raise AssertionError("must not run")

    fault = dataclasses.replace(NAN_ROWS, name="faults on these rows", check="device_fault")
    impl = dataclasses.replace(KNOWN, name="never_both", fn=never,
                               caps=dataclasses.replace(KNOWN.caps, known_defects=(NAN_ROWS, fault)))
    assert judge_once(impl, br(2, 1), gradients=False).refused == fault.summary()
    assert calls == []


def test_a_campaign_judges_covered_cases_and_reports_the_rest():
    result = fuzz(KNOWN, attention_cases(KNOWN.caps), max_examples=80, save_to_file=False,
                  stop_at_first=False, seconds=200)
    hits = {s: n for s, n in result.refused.items() if s.startswith(f"{KNOWN_PREFIX} hit")}
    assert sum(hits.values()) > 0, result.refused
    assert "judged, failing as known upstream defects" in result.refusal_note()
    # printed whole below the table, whose detail column cuts it
    from fuzzattn.campaigns.outcome import FAIL, Outcome
    from fuzzattn.cli.tables import after_campaigns
    shown = after_campaigns([Outcome("fuzz", "two_bugs_one_known float32", FAIL, False,
                                     result.cases, campaign=result)])
    assert f"  two_bugs_one_known float32: {result.refusal_note()}" in shown
    assert all(d.check_key == "out" for d in result.defects), \
        [(d.check_key, str(d.judged.case)) for d in result.defects]
    # the chunk bug is found on bottom-right cases though every such case is covered: drawn
    # there, or judged there when its needed factors were found (either alignment fails)
    assert any(d.judged.case.causal == "bottom_right" or d.factors.get("causal") == "either"
               for d in result.defects), [(d.needs(), str(d.judged.case)) for d in result.defects]


# -- a backward's device fault: the forward is still judged ------------------------------------
BACKWARD_FAULT = KnownDefect("backward faults on every case", HERE, lambda case: True,
                             "example.json", backward=True, check="device_fault")


def _never_backward(*args, **kwargs):
    raise AssertionError("the backward must not run in this process")


FORWARD_ONLY = dataclasses.replace(
    sdpa.IMPL, name="sdpa_backward_faults", backward_fn=_never_backward,
    caps=dataclasses.replace(sdpa.IMPL.caps, known_defects=(BACKWARD_FAULT,)))


def test_a_backward_device_fault_passes_over_only_the_gradients():
    case = AttentionCase(1, 2, 2, 5, 9, 16, causal="top_left", data_seed=3)
    judged = judge_once(FORWARD_ONLY, case)
    assert judged.passed and judged.refused is None
    assert judged.forward_only == BACKWARD_FAULT.summary()
    checks = {v.check for v in judged.verdicts}
    assert "out" in checks and not any(c.startswith("grad_") for c in checks), checks
    # a forward failure on such a case is still a finding
    def doubled(q, k, v, *, causal, scale):
        out, lse = sdpa.sdpa_forward(q, k, v, causal=causal, scale=scale)
        return 2 * out, lse

    broken = dataclasses.replace(FORWARD_ONLY, name="sdpa_backward_faults_doubled", fn=doubled)
    assert judge_once(broken, case).first_failure.check == "out"


def test_an_isolated_judge_runs_the_gradients_a_device_fault_covers():
    asked = []

    def isolated(case, gradients):
        asked.append(gradients)
        return judge(sdpa.IMPL, case, gradients=gradients)

    case = AttentionCase(1, 1, 1, 4, 4, 16, data_seed=5)
    judged = judge_once(FORWARD_ONLY, case, judge_fn=isolated)
    assert asked == [True] and judged.forward_only is None
    assert any(v.check.startswith("grad_") for v in judged.verdicts)


def test_a_campaign_counts_cases_judged_without_gradients_not_passed_over():
    result = fuzz(FORWARD_ONLY, attention_cases(FORWARD_ONLY.caps, dtype="float32"),
                  max_examples=20, save_to_file=False, seconds=200)
    assert result.passed and result.cases == 20, result
    assert result.refused == {} and result.forward_only == {BACKWARD_FAULT.summary(): 20}
    assert result.refusal_note() == ("100% of draws judged without gradients: "
                                      f"{BACKWARD_FAULT.summary()} (20)")


def test_a_replay_failing_as_the_implementations_known_defect_is_an_expected_failure(tmp_path):
    """A file pinning one kernel's defect can land in another kernel's declared known defect (an
    sdpa file on flex's decoding inputs): that replay is xfail, and any other failure still fails."""
    from fuzzattn.campaigns.outcome import FAIL, XFAIL
    from fuzzattn.campaigns.regression_file import parse
    from fuzzattn.campaigns.file_replay import replay_one

    def record(case):
        return parse({"schema": 2, "case": case.to_dict(), "impl": "other",
                      "check": "nonfinite", "where": ""})

    known = replay_one(record(br(2, 1)), KNOWN)
    assert (known.verdict, known.passed) == (XFAIL, True), known.message
    assert "known defect (nonfinite, example.json)" in known.message
    other = replay_one(record(br(2, 17)), KNOWN)                 # the chunk bug
    assert (other.verdict, other.passed) == (FAIL, False), other.message


def test_an_unsafe_defect_is_judged_only_in_a_worker_process():
    """An unsafe defect (its kernel leaves the process unfit to judge on) is passed over in-process
    whatever check it names; an isolated judge runs the case and tallies the failure to it."""
    unsafe = dataclasses.replace(NAN_ROWS, unsafe=True)
    impl = dataclasses.replace(KNOWN, name="two_bugs_unsafe", caps=dataclasses.replace(
        KNOWN.caps, known_defects=(unsafe,)))
    assert judge_once(impl, br(2, 1), gradients=False).refused == unsafe.summary()
    asked = []

    def isolated(case, gradients):
        asked.append(case)
        return judge(KNOWN, case, gradients=gradients)

    judged = judge_once(impl, br(3, 1), judge_fn=isolated, gradients=False)
    assert asked and set(asked) == {br(3, 1)}     # (a failure is judged again for flakiness)
    assert judged.refused == unsafe.tally()


def test_a_file_an_unsafe_defect_covers_is_replayed_in_a_worker_process():
    from fuzzattn.campaigns.regression_file import parse
    from fuzzattn.campaigns.file_replay import needs_isolation

    def record(case, check="out"):
        return parse({"schema": 2, "case": case.to_dict(), "impl": "other", "check": check,
                      "where": ""})

    unsafe = dataclasses.replace(KNOWN, name="two_bugs_unsafe", caps=dataclasses.replace(
        KNOWN.caps, known_defects=(dataclasses.replace(NAN_ROWS, unsafe=True),)))
    assert needs_isolation(record(br(2, 1)), unsafe)            # covered: in a worker
    assert not needs_isolation(record(br(2, 1)), KNOWN)         # the same defect, safe
    assert not needs_isolation(record(AttentionCase(1, 1, 1, 2, 2, 16)), unsafe)  # not covered
    assert needs_isolation(record(br(2, 1), "segfault"))        # a process verdict, always
