"""Fuzzing campaigns: judge drawn cases, turn the shrunk failure into a regression file.

`check_case` is what every Hypothesis test body calls. Hypothesis runs the minimal failing
example one last time with `is_final` set after shrinking; only that run writes a file, so
`regressions/` receives the shrunk case and never the intermediate ones.

A case is judged once per process: the verdict is remembered by (implementation, case key), and
Hypothesis's replays of a case get the same answer. So a kernel whose result changes between
calls (an autotuner's first call, a race) cannot make Hypothesis stop with its FlakyFailure;
instead the failing case that is reported (Hypothesis's final run of the shrunk case, or any
failure judged outside Hypothesis) is rerun `FLAKY_RERUNS` times, and if any rerun passes, it
fails with the `flaky` verdict, which says how many runs failed and how. The shrinker's
intermediate failures are not rerun: they are never reported, and rerunning each would triple
the cost of shrinking.

Cases an implementation refuses with one of its declared errors (`Capabilities.refusals`) are
counted per campaign and rejected (Hypothesis draws another), never counted as passes; so are
cases covered by a known upstream defect it declares (`Capabilities.known_defects`), which are
not run at all.

`fuzz` runs a campaign outside pytest (the CLI's `fuzz`, `gate` and `mutants`), with a case
and/or time budget, and returns a `Campaign`.

Isolation (fuzzattn.isolation.supervisor): `fuzz(isolate=True)` judges through one worker process per
campaign; `use_workers(pool)` makes `check_case` judge the run's implementations in a WorkerPool
(the pytest plugin's --fuzzattn-isolate). Either way the memo is keyed as in-process judging is,
and hang/segfault/device_fault verdicts are not rerun for flakiness: each rerun would cost a
worker restart (and a hang its whole timeout), and the memo already keeps Hypothesis consistent.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from pathlib import Path

from hypothesis import Phase, given, reject, seed as hypothesis_seed, settings, strategies as st
from hypothesis.control import current_build_context, currently_in_test_context
from hypothesis.errors import FlakyFailure, HypothesisException

from fuzzattn.campaigns import regression_file
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.implementation import Implementation
from fuzzattn.contract.known_defects import KNOWN_PREFIX, known_defect
from fuzzattn.judge.judge import JudgedCase, default_device, judge
from fuzzattn.judge.verdict import PROCESS_CHECKS, Verdict
from fuzzattn.platform.gc_tuning import freeze_long_lived

FLAKY_RERUNS = 2          # extra judgements of a failing case; any pass makes it flaky
_MEMO_SIZE = 20_000       # remembered verdicts per process (a few hundred bytes each)


class Counterexample(AssertionError):
    """A case on which an implementation failed a check; carries the judged case and its file."""

    def __init__(self, judged: JudgedCase, written: regression_file.Written | None):
        self.judged = judged
        self.written = written
        lines = [judged.describe()]
        if written is not None:
            lines.append(f"  regression file: {regression_file.display_path(written.path)}"
                         + (f" (fallback: {written.fallback_reason})" if written.fallback_reason else ""))
            lines.append(f"  replay:  {regression_file.replay_command(written.path, judged.cli_name)}")
        super().__init__("\n".join(lines))

    @property
    def path(self) -> Path | None:
        return self.written.path if self.written is not None else None


class Refused(Exception):
    """A drawn case the implementation refused with a declared error (raised outside Hypothesis)."""


def _is_final_run() -> bool:
    if not currently_in_test_context():
        return True            # called directly (replay, a unit test): every failure is final
    return current_build_context().is_final


def save(judged: JudgedCase, directory=None) -> regression_file.Written:
    """Write the judged failure as a regression file (create-if-absent, with fallback)."""
    return regression_file.write(regression_file.from_judged(judged), directory)


_memo: collections.OrderedDict[tuple[str, str], JudgedCase] = collections.OrderedDict()
_rerun: set = set()      # memo keys whose failure was rerun for flakiness
refusal_counts: collections.Counter[tuple[str, str]] = collections.Counter()  # (impl, summary)
judged_total = 0      # cases judged by this process (reruns for flakiness not counted)


# The run's worker pool (fuzzattn.isolation.supervisor.WorkerPool) and the implementations it
# covers (by cli_name), or None: set by use_workers, read by check_case.
_workers: tuple | None = None


def use_workers(pool, covers) -> tuple | None:
    """Judge `check_case` calls for implementations named in `covers` (cli names) through `pool`
    (None: in-process again); returns the previous setting, to restore it. Implementations a test
    builds for itself stay in-process: a worker could not import them by name."""
    global _workers
    previous, _workers = _workers, (pool, frozenset(covers)) if pool is not None else None
    return previous


def forget_verdicts() -> None:
    """Empty this process's memo of verdicts, so the same cases are judged again (a benchmark
    timing one campaign several times; a memo hit costs no judging)."""
    _memo.clear()
    _rerun.clear()


def _run_judge(impl: Implementation, device):
    """How check_case judges `impl` in this run: a pooled worker's judge, or None (in-process)."""
    if _workers is None or impl.cli_name not in _workers[1]:
        return None
    return _workers[0].get(impl).judge


def judge_once(impl: Implementation, case: AttentionCase, device=None, *,
               judge_fn=None, gradients: bool = True) -> JudgedCase:
    """judge(), remembered per (implementation, case, gradients judged or not), with failures
    rerun for flakiness. `judge_fn(case, gradients=...) -> JudgedCase` judges instead of judge()
    in this process (an isolated worker's); the memo key is the same either way."""
    key = (impl.cli_name, case.key(), gradients)
    defect = known_defect(impl.caps.known_defects, case, device or default_device(), gradients)
    if defect is not None:         # counted and rejected by the callers, like a refusal
        return JudgedCase(impl=impl.name, case=case, verdicts=[], refused=defect.summary(),
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
    if _is_final_run():
        _memo[key] = _checked_for_flakiness(impl, case, run, key, _memo[key])
    return _memo[key]


def _checked_for_flakiness(impl, case, run, key, judged: JudgedCase) -> JudgedCase:
    """`judged`, or its flaky version if a rerun of its failure passes (once per key)."""
    if (not judged.failures or key in _rerun
            or judged.first_failure.check in ("inputs_drifted",) + PROCESS_CHECKS):
        return judged
    _rerun.add(key)
    return _flaky_or_consistent(impl, case, run, judged)


def _flaky_or_consistent(impl, case, run, judged: JudgedCase) -> JudgedCase:
    reruns = [run(case) for _ in range(FLAKY_RERUNS)]
    if all(not r.passed for r in reruns):
        return judged
    runs = 1 + len(reruns)
    failed = 1 + sum(not r.passed for r in reruns)
    first = judged.first_failure
    detail = (f"failed in {failed} of {runs} runs of the same case (first: {first.check}"
              + (f" error={first.error:.3g} allowed={first.allowed:.3g}"
                 if first.error is not None and first.allowed is not None else "")
              + (f": {first.detail}" if first.detail else "") + "); passed in the others")
    flaky = Verdict(impl=impl.name, case=case, check="flaky", passed=False, detail=detail,
                    where=first.where, heatmap=first.heatmap)
    return dataclasses.replace(judged, verdicts=[flaky] + judged.verdicts)


def check_case(impl: Implementation, case: AttentionCase, *, save_to_file: bool = True,
               regressions_dir=None, device=None, judge_fn=None,
               gradients: bool = True) -> JudgedCase:
    """Judge one case; raise Counterexample on failure (writing a file on the final run).
    `judge_fn` as in judge_once; by default the run's worker pool if it covers `impl`.
    gradients=False judges the forward only (a declared backward has its own test)."""
    judged = judge_once(impl, case, device=device,
                        judge_fn=judge_fn or _run_judge(impl, device), gradients=gradients)
    return _raise_unless_passed(impl, case, judged, save_to_file=save_to_file,
                                regressions_dir=regressions_dir)


def _raise_unless_passed(impl: Implementation, case: AttentionCase, judged: JudgedCase, *,
                         save_to_file: bool, regressions_dir) -> JudgedCase:
    """check_case's verdict on an already judged case: returns it when it passed, else raises
    (a skip, a refusal, a Counterexample with its file written on the final run)."""
    if judged.skipped is not None:
        raise RuntimeError(f"{case} was drawn but cannot run: {judged.skipped}")
    if judged.refused is not None:
        refusal_counts[(impl.name, judged.refused)] += 1
        if currently_in_test_context():
            reject()               # not a pass: Hypothesis draws another case
        raise Refused(judged.refused)
    if not judged.passed:
        written = save(judged, regressions_dir) if (save_to_file and _is_final_run()) else None
        raise Counterexample(judged, written)
    return judged


@dataclasses.dataclass
class Campaign:
    """What fuzzing one implementation (and one dtype) found."""
    impl: str
    cases: int                          # cases judged, shrinking included
    seconds: float
    counterexample: Counterexample | None = None
    cases_to_first_failure: int | None = None
    error: str | None = None            # the campaign could not run (e.g. nothing drawable)
    budget_hit: bool = False            # the time cap stopped it before max_examples
    refused: dict[str, int] = dataclasses.field(default_factory=dict)   # summary -> draws

    @property
    def passed(self) -> bool:
        return self.counterexample is None and self.error is None

    @property
    def refused_total(self) -> int:
        return sum(self.refused.values())

    def refusal_note(self) -> str:
        """'12% of draws refused: RuntimeError: No available kernel (30)', then the share passed
        over as known upstream defects, or '' when there were none of either."""
        drawn = self.refused_total + self.cases
        notes = []
        for known, what in ((False, "refused"), (True, "passed over")):
            counts = {s: n for s, n in self.refused.items() if s.startswith(KNOWN_PREFIX) == known}
            if counts:
                top = ", ".join(f"{summary} ({n})" for summary, n in
                                sorted(counts.items(), key=lambda kv: -kv[1])[:2])
                notes.append(f"{100 * sum(counts.values()) / drawn:.0f}% of draws {what}: {top}")
        return "; ".join(notes)

    @property
    def mostly_refused(self) -> bool:
        return self.refused_total > self.cases


def fuzz(impl: Implementation, strategy: st.SearchStrategy[AttentionCase], *, max_examples: int,
         seconds: float | None = None, hypothesis_seed_value: int | None = 0,
         save_to_file: bool = True, regressions_dir=None, device=None,
         shrink: bool = True, isolate: bool = False, timeout: float | None = None,
         judge_fn=None, gradient_every: int = 1, database=None,
         database_key: bytes | None = None) -> Campaign:
    """Judge up to `max_examples` drawn cases, or until `seconds` pass, and shrink the first
    failure. Once the time cap is spent, draws are no longer judged: before a failure the search
    ends at the next draw; during shrinking the shrink winds down, and Hypothesis's final replay
    of the smallest failure found so far is still judged, reported and saved.

    `isolate`: judge every case in one supervised worker process, reused across the campaign's
    cases, so a hang (no result within `timeout` s, default isolation.DEFAULT_TIMEOUT), a dead
    process or a CUDA fault is a verdict that is shrunk and saved like any other. In-process (the
    default) a hanging kernel cannot be interrupted, so `timeout` without `isolate` is refused.
    The worker's start-up precedes the campaign's clock. `judge_fn(case)` judges through a
    caller's own (e.g. shared) IsolatedJudge instead.

    Gradients (implementations declaring a backward) are judged on every case by default;
    `gradient_every=N` judges them on one drawn case in N (chosen by the case's key, so a
    replay of a case judges what its first judgement did), for throughput campaigns where a
    backward costs several forwards. Once a failure of the forward is found, the rest of the
    campaign (its shrinking) judges the forward only: a smaller case that fails only in its
    gradients is another bug, and shrinking toward it would lose the one found.

    `database`: a Hypothesis ExampleDatabase (a seeded campaign only) whose failures saved under
    `database_key` are replayed first and where new ones are saved; the default key is the
    implementation's cli name, never the test function's source, so it survives code edits.
    None (the default) keeps no memory between runs."""
    if gradient_every < 1:
        raise ValueError(f"gradient_every={gradient_every} must be at least 1")
    if timeout is not None and not isolate:
        raise ValueError("timeout needs isolate=True: a call in this process cannot be interrupted")
    with contextlib.ExitStack() as stack:
        if isolate and judge_fn is None:
            from fuzzattn.isolation.supervisor import DEFAULT_TIMEOUT, IsolatedJudge
            judge_fn = stack.enter_context(IsolatedJudge(
                impl, timeout=timeout or DEFAULT_TIMEOUT, device=device)).judge
        return _fuzz(impl, strategy, max_examples=max_examples, seconds=seconds,
                     hypothesis_seed_value=hypothesis_seed_value, save_to_file=save_to_file,
                     regressions_dir=regressions_dir, device=device, shrink=shrink,
                     judge_fn=judge_fn, gradient_every=gradient_every, database=database,
                     database_key=database_key)


class _TimeIsUp(BaseException):
    """Raised from a campaign's test body once its time cap is spent before any failure: it ends
    the search at once (returning early would pass every later draw unjudged while Hypothesis
    went on drawing up to max_examples of them, ~1 ms a draw). A BaseException, as KeyboardInterrupt
    is, so that Hypothesis propagates it at once instead of recording and shrinking it."""


def _fuzz(impl, strategy, *, max_examples, seconds, hypothesis_seed_value, save_to_file,
          regressions_dir, device, shrink, judge_fn, gradient_every, database=None,
          database_key=None) -> Campaign:
    state = {"judged": 0, "first": None, "over": False, "forward_failed": False}
    with_gradients: dict[str, bool] = {}
    refused: collections.Counter[str] = collections.Counter()
    freeze_long_lived()        # before the clock: once per process (fuzzattn/platform/gc_tuning.py)
    start = time.perf_counter()

    def over_budget() -> bool:
        state["over"] = state["over"] or (seconds is not None and time.perf_counter() - start > seconds)
        return state["over"]

    phases = None if shrink else [Phase.explicit, Phase.reuse, Phase.generate]

    # report_multiple_bugs off: one campaign reports one counterexample; shrink it at once.
    @settings(max_examples=max_examples, database=None, deadline=None,
              derandomize=hypothesis_seed_value is None, print_blob=False,
              report_multiple_bugs=False,
              **({"phases": phases} if phases else {}))
    @given(strategy)
    def campaign(case):
        final = currently_in_test_context() and current_build_context().is_final
        if over_budget() and not final:
            if state["first"] is None:
                raise _TimeIsUp          # before any failure: the search ends here
            # While shrinking, unjudged draws pass: no candidate can improve on the smallest
            # failure so far, so the shrink winds down and its final replay is still judged.
            return
        # Decided once per case: Hypothesis's replays of a case must meet the same judgement.
        key = case.key()
        if key not in with_gradients:
            with_gradients[key] = not state["forward_failed"] and (
                # the key is a sha256 prefix: the same choice in every process and run
                gradient_every == 1 or int(key, 16) % gradient_every == 0)
        gradients = with_gradients[key]
        # One memo lookup a case: check_case's verdict on the judgement made here.
        judged = judge_once(impl, case, device=device, judge_fn=judge_fn, gradients=gradients)
        if judged.refused is not None:
            refused[judged.refused] += 1
            reject()
        state["judged"] += 1
        try:
            _raise_unless_passed(impl, case, judged, save_to_file=save_to_file,
                                 regressions_dir=regressions_dir)
        except Counterexample as found:
            if state["first"] is None:
                state["first"] = state["judged"]
                first = found.judged.first_failure
                state["forward_failed"] = not (first and first.check.startswith("grad_"))
            raise

    campaign._hypothesis_internal_database_key = database_key or impl.cli_name.encode()
    if hypothesis_seed_value is not None:
        campaign = hypothesis_seed(hypothesis_seed_value)(campaign)
        # @seed turns the example database off; a seeded campaign keeps the one it was given
        # (a derandomized one has none: Hypothesis refuses the pair)
        campaign._hypothesis_internal_use_settings = settings(
            campaign._hypothesis_internal_use_settings, database=database)
    result = dict(impl=impl.name)

    def finished(**kw) -> Campaign:
        return Campaign(cases=state["judged"], seconds=time.perf_counter() - start,
                        refused=dict(refused), **result, **kw)

    try:
        campaign()
    except _TimeIsUp:
        return finished(budget_hit=True)
    except Counterexample as found:
        return finished(counterexample=found, cases_to_first_failure=state["first"],
                        budget_hit=state["over"])
    except FlakyFailure as exc:
        # judge_once makes every case's verdict stable, so this means the strategy or the
        # harness changed between Hypothesis's runs: report it, never as an internal error.
        return finished(error=f"FlakyFailure: {' '.join(str(exc).split())[:300]}")
    except HypothesisException as exc:
        return finished(error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    return finished(budget_hit=state["over"])
