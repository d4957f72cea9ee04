"""Fuzzing campaigns: judge drawn cases, turn the shrunk failure into a regression file.

`check_case` is what every Hypothesis test body calls. Hypothesis runs the minimal failing
example one last time with `is_final` set after shrinking; only that run writes a file, so
`regressions/` receives the shrunk case and never the intermediate ones.

A case is judged once per process: the verdict is remembered by (implementation, case key), so
Hypothesis's replays of a case get the same answer and a kernel whose result changes between calls
(an autotuner's first call, a race) cannot end it with a FlakyFailure. The failing case reported
(Hypothesis's final run, or a failure judged outside it) is rerun instead (campaigns/flaky.py): if
any rerun passes, it fails as `flaky`, saying how many runs failed and how. The shrinker's
intermediate failures are not rerun: never reported, rerunning each would triple shrinking's cost.

Cases an implementation refuses with one of its declared errors (`Capabilities.refusals`) are
counted per campaign and rejected (Hypothesis draws another), never counted as passes; so are
cases covered by a known upstream defect it declares (`Capabilities.known_defects`) that cannot
be judged here (a backward's device fault keeps only the gradients from running). Failures that
a judged known defect explains are tallied to it (judge_once).

`fuzz` runs a campaign outside pytest (the CLI's commands) within a case and/or time budget.

Isolation (fuzzattn.isolation.supervisor): `fuzz(isolate=True)` or `use_workers(pool)` judge in
worker processes, with the memo keyed as in-process; hang/segfault/device_fault verdicts are not
rerun for flakiness (a rerun would cost a worker restart, a hang its whole timeout).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import time

from hypothesis import Phase, given, reject, seed as hypothesis_seed, settings, strategies as st
from hypothesis.control import current_build_context, currently_in_test_context
from hypothesis.errors import FlakyFailure, HypothesisException

from fuzzattn.campaigns import hypothesis_internals
from fuzzattn.campaigns.defects import DefectBook, check_key, failure_keys, same_symptom
from fuzzattn.campaigns.flaky import flaky_or_consistent
from fuzzattn.campaigns.found import (Campaign, Counterexample, Refused,  # noqa: F401 (public)
                                      finish_shrinks, fold_mixtures, record, report_stashed, save)
from fuzzattn.campaigns.pooled import run_judge, use_workers  # noqa: F401 (public)
from fuzzattn.campaigns.pruned import Pruned as _Pruned
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.implementation import Implementation
from fuzzattn.contract.known_defects import covering
from fuzzattn.judging.judge import JudgedCase, default_device, judge
from fuzzattn.judging.verdict import PROCESS_CHECKS
from fuzzattn.platform.gc_tuning import freeze_long_lived
from fuzzattn.run.loader import findable_spec

_MEMO_SIZE = 20_000       # remembered verdicts per process (a few hundred bytes each)
# Shrinking's shares of a time cap: a round's shrink may take a quarter (a cause met early must
# not starve the search), and the causes left cut short or unshrunk share 15% more past the cap.
ROUND_SHRINK_SHARE = 0.25
FINISH_SHRINK_SHARE = 0.15


def _is_final_run() -> bool:
    # called directly (replay, a unit test): every failure is final
    return not currently_in_test_context() or current_build_context().is_final


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
    if _is_final_run():
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


def check_case(impl: Implementation, case: AttentionCase, *, save_to_file: bool = True,
               regressions_dir=None, device=None, judge_fn=None,
               gradients: bool = True) -> JudgedCase:
    """Judge one case; raise Counterexample on failure (writing a file on the final run).
    `judge_fn` as in judge_once; by default the run's worker pool if it covers `impl`.
    gradients=False judges the forward only (a declared backward has its own test)."""
    __tracebackhide__ = True        # a failure's traceback ends in the caller's test
    judged = judge_once(impl, case, device=device,
                        judge_fn=judge_fn or run_judge(impl), gradients=gradients)
    return _raise_unless_passed(impl, case, judged, save_to_file=save_to_file,
                                regressions_dir=regressions_dir)


def _raise_unless_passed(impl: Implementation, case: AttentionCase, judged: JudgedCase, *,
                         save_to_file: bool, regressions_dir) -> JudgedCase:
    """check_case's verdict on an already judged case: returns it when it passed, else raises
    (a skip, a refusal, a Counterexample with its file written on the final run)."""
    __tracebackhide__ = True
    if judged.skipped is not None:
        raise RuntimeError(f"{case} was drawn but cannot run: {judged.skipped}")
    if judged.refused is not None:
        refusal_counts[(impl.name, judged.refused)] += 1
        if currently_in_test_context():
            reject()               # not a pass: Hypothesis draws another case
        raise Refused(judged.refused)
    if judged.forward_only is not None:
        forward_only_counts[(impl.name, judged.forward_only)] += 1
    if not judged.passed:
        written = None
        if save_to_file and _is_final_run():    # file and replay name it as --impl finds it
            judged = dataclasses.replace(judged, cli_name=findable_spec(impl))
            written = save(judged, regressions_dir)
        raise Counterexample(judged, written)
    return judged


def fuzz(impl: Implementation, strategy: st.SearchStrategy[AttentionCase], *, max_examples: int | None,
         seconds: float | None = None, hypothesis_seed_value: int | None = 0,
         save_to_file: bool = True, regressions_dir=None, device=None,
         shrink: bool = True, isolate: bool = False, timeout: float | None = None,
         stop_at_first: bool = True, first_cases=(),
         judge_fn=None, gradient_every: int = 1, database=None,
         database_key: bytes | None = None) -> Campaign:
    """Judge up to `max_examples` drawn cases (None: no limit, `seconds` alone ends it), or until
    `seconds` pass, and shrink the first failure; `Campaign.ended` says which ended it. Once the time cap is spent, draws are no longer judged: before a failure the search
    ends at the next draw; during shrinking the shrink winds down, and Hypothesis's final replay
    of the smallest failure found so far is still judged, reported and saved.

    `stop_at_first=False` keeps going after a counterexample until the budget ends, in rounds
    (each a Hypothesis run with the budget left and its own seed), and reports every distinct
    defect once (`Campaign.defects`, campaigns/defects.py): a failure that a defect already found
    explains is tallied to it and passes; a new one is shrunk and saved. While a round shrinks,
    a failure with another check is kept for later, never shrunk toward. `first_cases` are
    judged before any draw and saved unshrunk when they fail (the load probe's case).

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

    `database`: a Hypothesis ExampleDatabase (a seeded campaign only; None: no memory between
    runs), its failures under `database_key` (default: the cli name, which survives code edits)
    replayed first. Each defect left cut short or unshrunk gets its own shrink (found.py)."""
    if gradient_every < 1:
        raise ValueError(f"gradient_every={gradient_every} must be at least 1")
    if (unsupported := hypothesis_internals.campaign_internals_supported()) is not None:
        raise RuntimeError(unsupported)
    if timeout is not None and not isolate:
        raise ValueError("timeout needs isolate=True: a call in this process cannot be interrupted")
    if max_examples is None and seconds is None:
        raise ValueError("max_examples=None needs seconds: nothing else would end the campaign")
    with contextlib.ExitStack() as stack:
        if isolate and judge_fn is None:
            from fuzzattn.isolation.supervisor import DEFAULT_TIMEOUT, IsolatedJudge
            judge_fn = stack.enter_context(IsolatedJudge(
                impl, timeout=timeout or DEFAULT_TIMEOUT, device=device)).judge
        return _fuzz(impl, strategy, max_examples=max_examples, seconds=seconds,
                     hypothesis_seed_value=hypothesis_seed_value, save_to_file=save_to_file,
                     regressions_dir=regressions_dir, device=device, shrink=shrink,
                     stop_at_first=stop_at_first, first_cases=tuple(first_cases),
                     judge_fn=judge_fn, gradient_every=gradient_every, database=database,
                     database_key=database_key)


UNBOUNDED = 2**31 - 1     # Hypothesis's max_examples for a campaign only its time cap ends


class _TimeIsUp(BaseException):
    """Raised from a campaign's test body once its time cap is spent before any failure: it ends
    the search at once (returning would pass later draws unjudged, ~1 ms each, up to
    max_examples). A BaseException, so that Hypothesis propagates it, never shrinks it."""


def _fuzz(impl, strategy, *, max_examples, seconds, hypothesis_seed_value, save_to_file,
          regressions_dir, device, shrink, stop_at_first, first_cases, judge_fn, gradient_every,
          database=None, database_key=None) -> Campaign:
    # drawn: cases judged outside shrinking (the case budget); target: the symptom (check key,
    # failure keys) the round's shrink holds to (defects.same_symptom), None before the round's
    # first new failure; cut: the round's shrink wound down early (the cap or its share of it)
    state = {"judged": 0, "first": None, "over": False, "forward_failed": False, "drawn": 0,
             "target": None, "raised": False, "cut": False, "shrink_start": 0.0}
    with_gradients: dict[str, bool] = {}
    refused: collections.Counter[str] = collections.Counter()
    forward_only: collections.Counter[str] = collections.Counter()
    def variant_judge(variant, gradients):    # a defect's trigger and cure tests (defects.py)
        return judge_once(impl, variant, device=device, judge_fn=judge_fn, gradients=gradients)

    book = DefectBook(impl.caps, variant_judge)
    pruned = _Pruned()
    tallied: set[str] = set()           # case keys already counted as a known defect's hit
    stash: dict[str, JudgedCase] = {}   # new failures met while shrinking another (by check key)
    freeze_long_lived()        # before the clock: once per process (fuzzattn/platform/gc_tuning.py)
    start = time.perf_counter()

    def over_budget() -> bool:
        state["over"] = state["over"] or (seconds is not None and time.perf_counter() - start > seconds)
        return state["over"]

    phases = None if shrink else [Phase.explicit, Phase.reuse, Phase.generate]
    limit = UNBOUNDED if max_examples is None else max_examples

    # report_multiple_bugs off: one campaign reports one counterexample; shrink it at once.
    @settings(max_examples=limit, database=None, deadline=None, print_blob=False,
              derandomize=hypothesis_seed_value is None, report_multiple_bugs=False,
              **({"phases": phases} if phases else {}))
    @given(strategy)
    def campaign(case):
        final = currently_in_test_context() and current_build_context().is_final
        if not final and (over_budget() or state["target"] is not None and seconds is not None and
                          time.perf_counter() - state["shrink_start"] > ROUND_SHRINK_SHARE * seconds):
            if state["target"] is None:
                raise _TimeIsUp          # before any new failure: the search ends here
            # While shrinking, unjudged draws pass: no candidate can improve on the smallest
            # failure so far, so the shrink winds down and its final replay is still judged.
            state["cut"] = True
            return
        if pruned.seen(case):
            reject()                     # a configuration already seen not to compile for it
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
            if not pruned.record(case, judged.refused):
                refused[judged.refused] += 1
            reject()
        if judged.forward_only is not None:
            forward_only[judged.forward_only] += 1
        state["judged"] += 1
        if state["target"] is None:
            state["drawn"] += 1
            drawn_counts[impl.name] += 1
        if judged.failures and judged.skipped is None and not final:
            owner, alone = book.assign(judged)
            if owner is not None:        # a defect found already: tallied, not shrunk again
                if state["target"] is None and key not in tallied:
                    tallied.add(key)
                    owner.hits += 1
                    if alone:
                        owner.showed(judged)
                return
            if state["target"] is None:
                state["target"] = (check_key(judged), failure_keys(judged))
                state["shrink_start"] = time.perf_counter()
            elif not same_symptom(judged, *state["target"]):
                stash.setdefault(check_key(judged), judged)   # another new defect: later
                return
        try:
            _raise_unless_passed(impl, case, judged, save_to_file=save_to_file,
                                 regressions_dir=regressions_dir)
        except Counterexample as found:
            if state["first"] is None:
                state["first"] = state["judged"]
            if not state["raised"]:      # the round's first: what its shrink holds to
                state["raised"] = True
                first = found.judged.first_failure
                state["forward_failed"] = not (first and first.check.startswith("grad_"))
            raise

    hypothesis_internals.use_database_key(campaign, database_key or impl.cli_name.encode())
    if hypothesis_seed_value is not None:
        campaign = hypothesis_seed(hypothesis_seed_value)(campaign)
        # @seed turns the example database off; a seeded campaign keeps the one it was given
        # (a derandomized one has none: Hypothesis refuses the pair)
        hypothesis_internals.use_settings(campaign, settings(
            hypothesis_internals.settings_of(campaign), database=database))

    def finished(**kw) -> Campaign:
        report_stashed(book, stash, variant_judge, save_to_file, regressions_dir,
                       state["judged"])
        fold_mixtures(book)
        if shrink:
            finish_shrinks(book, variant_judge, save_to_file, regressions_dir,
                           seconds=None if seconds is None else FINISH_SHRINK_SHARE * seconds)
        kw.setdefault("budget_hit", state["over"])
        kw.setdefault("ended", "time" if state["over"] else "first failure" if stop_at_first
                      and book.defects else "cases" if state["drawn"] >= limit else "exhausted")
        return Campaign(cases=state["judged"], seconds=time.perf_counter() - start,
                        refused=dict(refused), forward_only=dict(forward_only), impl=impl.name, **kw,
                        counterexample=book.defects[0].counterexample if book.defects else None,
                        cases_to_first_failure=state["first"] if book.defects else None,
                        defects=list(book.defects), pruned=pruned.report())

    for case in first_cases:            # judged before any draw, not shrunk (the load probe's)
        try:
            check_case(impl, case, save_to_file=save_to_file, regressions_dir=regressions_dir,
                       device=device, judge_fn=judge_fn)
        except Refused as exc:
            if not pruned.record(case, str(exc)):
                refused[str(exc)] += 1
        except Counterexample as found:
            state["judged"] += 1
            if book.owner(found.judged) is None:
                state["first"] = state["first"] or state["judged"]
                record(book, found, variant_judge, shrunk=False, found_at=state["judged"])
        else:
            state["judged"] += 1
        state["drawn"] += 1
        drawn_counts[impl.name] += 1
    base = hypothesis_internals.settings_of(campaign)
    for round_number in itertools.count():
        # Each round draws anew (its own seed) with the budget left, and shrinks the first
        # failure that no defect found so far explains; known ones are tallied and pass.
        if stop_at_first and book.defects or state["drawn"] >= limit or over_budget():
            break
        state.update(target=None, forward_failed=False, raised=False, cut=False)
        # Later rounds skip the database's replay: it deletes every saved failure that does not
        # fail again, and the ones found so far now pass, tallied.
        later = {"phases": [p for p in base.phases if p != Phase.reuse]} if round_number else {}
        if round_number and hypothesis_seed_value is None:
            later["derandomize"] = False
        hypothesis_internals.use_settings(campaign, settings(
            base, max_examples=limit - state["drawn"], **later))
        if round_number:
            hypothesis_internals.use_seed(campaign, (hypothesis_seed_value or 0) + round_number)
        try:
            campaign()
        except _TimeIsUp:
            return finished(budget_hit=True)
        except Counterexample as found:
            defect = record(book, found, variant_judge, found_at=state["judged"])
            if state["cut"] and defect.counterexample is found:
                defect.shrink_note = "cut short"     # finish_shrinks goes on from it
        except FlakyFailure as exc:
            # judge_once makes every case's verdict stable, so this means the strategy or the
            # harness changed between Hypothesis's runs: report it, never as an internal error.
            return finished(error=f"FlakyFailure: {' '.join(str(exc).split())[:300]}")
        except HypothesisException as exc:
            return finished(error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        else:
            break                       # a round without a new defect: its budget is spent
    return finished()

