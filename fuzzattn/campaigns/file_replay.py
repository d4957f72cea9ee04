"""Replay regression files against implementations: drift check, expected failures, flaky files.

A replay is one judged case, read against what the file expects of that implementation:

    ok              passed, as a fixed bug should
    FAIL            failed a check (the message has the case, the heatmap and the replay command)
    inputs_drifted  the case no longer materialises the bits the file pins: nothing was run
    xfail           failed, and the file lists this implementation as known to fail it, or
                    failed as a known defect the implementation declares for the case (a file
                    pinning one kernel's defect can land in another's known defect)
    XPASS(strict)   passed although the file expects it to fail: fails the run (the defect is
                    fixed upstream, or the case stopped showing it: update the file)
    skip            the implementation cannot run the case here (the reason is given), or it
                    refused it with an error it declares (`Capabilities.refusals`: an SDPA
                    backend's "No available kernel"): neither a pass nor a failure, and not an
                    expected failure either, since nothing was computed

A file recorded as `flaky` is judged FLAKY_REPLAYS times and says how many runs failed.

A replay expected to hang (the file lists the implementation and records a hang, or a known hang
defect of the implementation covers the case) is not run: xfail, "not run" (`_expected_hang`).

A file recorded as hang, segfault or device_fault (PROCESS_CHECKS) would take an in-process replay
down with it, and so would a file whose case an implementation's unsafe known defect covers (on
that implementation): `needs_isolation` says so, and the callers (replay, gate, the pytest plugin)
judge it through an isolated worker's `judge_fn`.
"""
from __future__ import annotations

import dataclasses

import torch

from fuzzattn.campaigns.outcome import DRIFTED, FAIL, OK, SKIP, XFAIL, XPASS, Outcome
from fuzzattn.campaigns.regression_file import RegressionFile, display_path, replay_command
from fuzzattn.contract.implementation import Implementation
from fuzzattn.contract.known_defects import covering
from fuzzattn.judgement.judge import JudgedCase, default_device, judge
from fuzzattn.judging.verdict import PROCESS_CHECKS, Verdict

FLAKY_REPLAYS = 5


def needs_isolation(record: RegressionFile, impl: Implementation | None = None) -> bool:
    """The file records a failure that ends the process judging it in-process, or `impl`
    declares an unsafe known defect covering its case here (contract/known_defects.py)."""
    if record.check in PROCESS_CHECKS:
        return True
    return impl is not None and any(
        d.unsafe for d in covering(impl.caps.known_defects, record.case, default_device(), True))


def replay_one(record: RegressionFile, impl: Implementation, device=None, *,
               judge_fn=None) -> Outcome:
    """Judge `impl` on the file's case and read the result against the file's expectations.
    `judge_fn(case, expected_sha256=...)` judges instead of judge() here (an IsolatedJudge's)."""
    subject = f"{record.name} on {impl.name}"
    if judge_fn is None:
        def judge_fn(case, expected_sha256=None):
            return judge(impl, case, device=device, expected_sha256=expected_sha256)

    def outcome(status: str, message: str) -> Outcome:
        failure = judged.first_failure
        detail = judged.skipped or (f"refused: {judged.refused}" if judged.refused else "")
        if status in (FAIL, XFAIL, XPASS) and failure is not None:
            detail = failure.check + (f" {failure.error:.3g} / {failure.allowed:.3g}"
                                      if failure.error is not None and failure.allowed is not None else "")
        elif status == DRIFTED:
            detail = "inputs drifted"
        return Outcome("replay", subject, status, status in (OK, SKIP, XFAIL), detail=detail,
                       message=message, skipped=status == SKIP, judged=judged)

    header = f"regression file {display_path(record.path) if record.path else record.name}"
    if record.covers:
        header += f" (covers: {record.covers})"
    device_type = torch.device(device or default_device()).type
    hang = _expected_hang(impl, record, device_type)
    if hang is not None:
        judged = JudgedCase(impl.name, record.case, [Verdict(impl=impl.name, case=record.case,
                                                             check="hang", passed=False,
                                                             detail="not run: expected to hang")])
        return outcome(XFAIL, f"{header}: {impl.name} not run, expected to hang: {hang}")
    judged = judge_fn(record.case, expected_sha256=record.inputs_sha256)
    if record.check == "flaky" and judged.skipped is None:
        judged = _rerun_flaky(impl, record, judge_fn, judged)
    hint = f"  replay:  {replay_command(record.path or record.name, impl.cli_name)}"
    if judged.skipped:
        return outcome(SKIP, f"{header}: {judged.skipped}")
    if judged.refused:
        # A declared refusal on replay: the backend cannot run this case on this machine (e.g.
        # FLASH with an explicit mask on CUDA). Reported FAIL before, which made a file written
        # on one machine fail on another whose backend refuses the case.
        return outcome(SKIP, f"{header}: {impl.name} refused it (declared): {judged.refused}")
    failure = judged.first_failure
    if failure is not None and failure.check == "inputs_drifted":
        recorded = (record.versions or {}).get("torch", "unknown")
        return outcome(DRIFTED, f"{header}: inputs drifted: {failure.detail} "
                                         f"(recorded with torch {recorded})")
    expected = record.expected_failure(impl.name, device_type)
    if expected is not None:
        upstream = f" ({expected.upstream})" if expected.upstream else ""
        if judged.passed:
            return outcome(XPASS, f"{XPASS}: {header}: {impl.name} passed, but the file expects it "
                                           f"to fail: {expected.reason}{upstream}; remove the entry "
                                           f"from expected_failures if the defect is fixed\n{hint}")
        return outcome(XFAIL, f"{header}: {impl.name} fails as expected "
                                       f"({failure.check}): {expected.reason}{upstream}")
    if judged.passed:
        return outcome(OK, f"{header}: {impl.name} ok")
    known = _known_defect(impl, record, judged, device or default_device())
    if known is not None:
        return outcome(XFAIL, f"{header}: {impl.name} fails as its known defect "
                              f"({known.check}, {known.regression}): {known.name}")
    return outcome(FAIL, f"{header}\n{judged.describe()}\n{hint}")


def _expected_hang(impl, record, device_type: str) -> str | None:
    """Why `impl` is expected to hang on the file's case here, or None. Such a replay is not run
    (as pytest's xfail(run=False)): it would only wait out the worker's timeout, up to minutes
    for a per-shape compiler, on every replay. The file still replays on every other
    implementation and device; an upstream fix shows when the entry is removed."""
    expected = record.expected_failure(impl.name, device_type)
    if expected is not None and record.check == "hang":
        return expected.reason + (f" ({expected.upstream})" if expected.upstream else "")
    hangs = [d for d in covering(impl.caps.known_defects, record.case, device_type, True)
             if d.check == "hang"]
    return f"its known defect ({hangs[0].regression}): {hangs[0].name}" if hangs else None


def _known_defect(impl, record, judged: JudgedCase, device):
    """The implementation's declared known defect this failure is, if any (replays judge
    gradients wherever the implementation has a backward)."""
    covered = covering(impl.caps.known_defects, record.case, device, gradients=True)
    return next((defect for defect in covered if defect.matches(judged)), None)


def _rerun_flaky(impl, record, judge_fn, judged: JudgedCase) -> JudgedCase:
    runs = [judged] + [judge_fn(record.case) for _ in range(FLAKY_REPLAYS - 1)]
    failed = [r for r in runs if not r.passed]
    if not failed or any(r.skipped for r in runs):
        return judged
    first = failed[0].first_failure
    verdict = Verdict(impl=impl.name, case=record.case, check="flaky", passed=False,
                      detail=f"failed in {len(failed)} of {len(runs)} replays "
                             f"(first: {first.check}: {first.detail or first.where})")
    return dataclasses.replace(failed[0], verdicts=[verdict] + failed[0].verdicts)
