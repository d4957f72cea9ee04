"""The verdict memo: a case is judged once per process, and its failure rerun for flakiness.

The verdict is remembered by (implementation, case key, gradients judged or not), so Hypothesis's
replays of a case get the same answer and a kernel whose result changes between calls (an
autotuner's first call, a race) cannot end a campaign with a FlakyFailure. The failing case
reported (Hypothesis's final run, or a failure judged outside it) is rerun instead
(campaigns/flaky.py): if any rerun passes, it fails as `flaky`, saying how many runs failed and
how. The shrinker's intermediate failures are not rerun: never reported, rerunning each would
triple shrinking's cost; nor are hang/segfault/device_fault verdicts (a rerun would cost a worker
restart, a hang its whole timeout).

Cases covered by a known upstream defect the implementation declares (`Capabilities.known_defects`)
that cannot be judged here come back refused (a backward's device fault keeps only the gradients
from running); failures a judged known defect explains come back tallied to it.

The process's counters live here too: cases judged, drawn per implementation, refused and judged
without gradients, read by the CLI's progress line and the pytest plugin's summary.
"""
from __future__ import annotations

import collections
import dataclasses

from hypothesis import currently_in_test_context

from fuzzattn.campaigns.flaky import flaky_or_consistent
from fuzzattn.campaigns.hypothesis_internals import final_run
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.implementation import Implementation
from fuzzattn.contract.known_defects import covering
from fuzzattn.judgement.judge import JudgedCase, default_device, judge
from fuzzattn.judging.verdict import PROCESS_CHECKS

_MEMO_SIZE = 20_000       # remembered verdicts per process (a few hundred bytes each)


def is_final_run() -> bool:
    # called directly (replay, a unit test): every failure is final
    return not currently_in_test_context() or final_run()


_memo: collections.OrderedDict[tuple[str, str], JudgedCase] = collections.OrderedDict()
_rerun: set = set()      # memo keys whose failure was rerun for flakiness
refusal_counts: collections.Counter[tuple[str, str]] = collections.Counter()  # (impl, summary)
# cases judged without their gradients, a known defect keeping them from this process
forward_only_counts: collections.Counter[tuple[str, str]] = collections.Counter()
judged_total = 0      # cases judged by this process (reruns for flakiness not counted)
# cases drawn by campaigns (max_examples counts them), per implementation; shrinking draws none
drawn_counts: collections.Counter[str] = collections.Counter()


def forget_verdicts() -> None:
    """Empty this process's memo of verdicts: the same cases are judged again (a benchmark)."""
    _memo.clear()
    _rerun.clear()


def judge_once(impl: Implementation, case: AttentionCase, device=None, *,
               judge_fn=None, gradients: bool = True) -> JudgedCase:
    """judge(), remembered per (implementation, case, gradients judged or not), with failures
    rerun for flakiness. `judge_fn(case, gradients=...) -> JudgedCase` judges instead of judge()
    in this process (an isolated worker's); the memo key is the same either way."""
    key = (impl.cli_name, case.key(), gradients)
    defects = covering(impl.caps.known_defects, case, device or default_device(), gradients)
    # One covering defect that cannot be judged here keeps the case from running, whatever the
    # others allow: a sliced bf16 bottom-right sdpa case is cuDNN's judged mask leak and the
    # backward's device fault, which in this process would poison the CUDA context of every
    # later case. When all such defects are the backward's, the forward alone is judged.
    unjudged = [d for d in defects if not d.judged(isolated=judge_fn is not None)]
    if unjudged and gradients and all(d.backward for d in unjudged):
        forward = judge_once(impl, case, device, judge_fn=judge_fn, gradients=False)
        return dataclasses.replace(forward, forward_only=unjudged[0].summary())
    if unjudged:
        # counted and rejected by the callers, like a refusal
        return JudgedCase(impl=impl.name, case=case, verdicts=[], refused=unjudged[0].summary(),
                          cli_name=impl.cli_name)
    if judge_fn is not None:
        run = lambda c: judge_fn(c, gradients=gradients)  # noqa: E731
    else:
        run = lambda c: judge(impl, c, device=device, gradients=gradients)  # noqa: E731
    if key in _memo:
        _memo.move_to_end(key)
    else:
        global judged_total
        _memo[key] = run(case)
        judged_total += 1
        if len(_memo) > _MEMO_SIZE:
            _rerun.discard(_memo.popitem(last=False)[0])
    if is_final_run():
        _memo[key] = _checked_for_flakiness(case, run, key, _memo[key])
    hit = next((d for d in defects if d.matches(_memo[key])), None)
    if hit is not None:
        # a known defect's own failure: tallied to it by the callers, never a finding
        return dataclasses.replace(_memo[key], refused=hit.tally())
    return _memo[key]


def _checked_for_flakiness(case, run, key, judged: JudgedCase) -> JudgedCase:
    """`judged`, or its flaky version if a rerun of its failure passes (once per key)."""
    if (not judged.failures or key in _rerun
            or judged.first_failure.check in ("inputs_drifted",) + PROCESS_CHECKS):
        return judged
    _rerun.add(key)
    return flaky_or_consistent(case, run, judged)
