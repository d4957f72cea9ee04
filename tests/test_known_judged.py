"""Known upstream defects judged, not skipped (fuzzattn/contract/known_defects.py): a covered case
still runs; a failure of the defect's recorded check is tallied to it, any other failure on it
is a finding, a pass is a pass; a device fault is still passed over in-process."""
from __future__ import annotations

import dataclasses

import torch

from fuzzattn.contract import AttentionCase, KnownDefect
from fuzzattn.campaigns.campaign import fuzz, judge_once
from fuzzattn.contract.known_defects import KNOWN_PREFIX
from fuzzattn.judging.judge import default_device
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
    assert all(d.check_key == "out" for d in result.defects), \
        [(d.check_key, str(d.judged.case)) for d in result.defects]
    # the chunk bug on bottom-right cases is found though every such case is covered
    assert any(d.judged.case.causal == "bottom_right" for d in result.defects), \
        [(d.check_key, str(d.judged.case)) for d in result.defects]
