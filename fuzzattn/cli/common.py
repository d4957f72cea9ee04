"""What the commands share: the usage error, argument types, implementation lookup, running one
campaign as an Outcome, and the common ending (failure details, a total, the exit status)."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import signal
import time

from fuzzattn.campaigns import example_db
from fuzzattn.campaigns.outcome import ERROR, FAIL, OK, SKIP, Outcome
from fuzzattn.campaigns.regression_file import display_path, replay_command
from fuzzattn.cli import tables
from fuzzattn.contract.dtypes import DTYPES
from fuzzattn.platform import flight
from fuzzattn.contract.profiles import PROFILES, ProfileError

IMPL_METAVAR = "NAME|FILE.py:NAME|module:NAME"


class CLIError(Exception):
    """A problem with what was asked: printed as one line, exit status 2."""


def flattened(text) -> str:
    """The text on one line: every run of whitespace one space."""
    return " ".join(str(text).split())


# -- argument types -----------------------------------------------------------------------------
def whole_number(minimum: int, requirement: str):
    """An argparse type: an int >= minimum, else argparse's own one-line error."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} {requirement}")
        return value
    return convert


count = whole_number(1, "must be at least 1")
seed = whole_number(0, "must not be negative")


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def budget_options(p: argparse.ArgumentParser, examples_help: str, seconds_help: str) -> None:
    p.add_argument("--max-examples", type=count, metavar="N", help=examples_help)
    p.add_argument("--seconds", type=seconds, metavar="S", help=seconds_help)
    p.add_argument("--hypothesis-seed", type=seed, default=0, metavar="N",
                   help="which cases Hypothesis draws (default 0: the same cases every run; another "
                        "seed explores further). Not the data seed a case's tensors come from.")
    p.add_argument("--profile", choices=sorted(PROFILES), metavar="P",
                   help=f"size and budget profile, one of {', '.join(sorted(PROFILES))} (default: "
                        "FUZZATTN_PROFILE, else ci under CI, gpu with CUDA, dev otherwise)")


def isolation_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--isolate", action="store_true",
                   help="judge each case in a worker process (one per implementation, reused): a "
                        "hang, a dead process or a CUDA fault is a verdict and the run goes on. "
                        "Without it cases are judged at full speed in one watched process, and such "
                        "a case is saved and ends the run (see --keep-going)")
    p.add_argument("--timeout", type=seconds, metavar="S",
                   help="seconds a kernel call may take before it is a hang (default: derived "
                        "from the implementation's measured speed and the case's size, at least "
                        "60; isolated: 60)")
    p.add_argument("--keep-going", action="store_true",
                   help="after a hang, a dead process or a device fault, save the case and run "
                        "the command again isolated, so every campaign finishes")


def isolation(args) -> tuple[bool, float | None]:
    """(isolate, timeout) from --isolate / --timeout."""
    return bool(getattr(args, "isolate", False)), getattr(args, "timeout", None)


def isolation_flags(isolate: bool, timeout: float | None) -> str:
    """The options that repeat this run's isolation in a printed command."""
    return (" --isolate" if isolate else "") + (f" --timeout {timeout:g}" if timeout else "")


# -- set-up ---------------------------------------------------------------------------------------
def load_profile(name):
    from fuzzattn import settings
    try:
        return settings.load_profile(name)
    except ProfileError as exc:
        raise CLIError(str(exc)) from None


def resolve(spec: str, isolate: bool = False, timeout: float | None = None):
    """A registered implementation or mutant by name, or an outside one by FILE.py:NAME (its probe
    call in a worker process with `isolate`: a kernel that hangs or dies on it must not end us)."""
    from fuzzattn.run.loader import ImplementationLoadError, load_implementation
    from fuzzattn.run.registry import UnknownImplementationError, get
    try:
        if ":" in spec and isolate:
            from fuzzattn.isolation.pool import DEFAULT_TIMEOUT, load_isolated
            return load_isolated(spec, timeout=timeout or DEFAULT_TIMEOUT)
        if ":" in spec:
            return load_implementation(spec)
        return get(spec)
    except ImplementationLoadError as exc:
        raise CLIError(str(exc)) from None
    except UnknownImplementationError as exc:
        hint = ""
        if spec.endswith(".py") or os.sep in spec:
            hint = f" (an implementation in a file is named as {spec}:NAME)"
        raise CLIError(f"--impl: {exc.args[0]}{hint}") from None


def registered():
    from fuzzattn.run.registry import implementations
    return list(implementations().values())


def triton_interpreted() -> bool:
    from fuzzattn.triton_interpreter.backend import is_interpreted
    return is_interpreted()


def dtypes_of(impl, only: str | None) -> list[str]:
    if only is not None:
        if only not in impl.caps.dtypes:
            raise CLIError(f"--dtype {only} is not declared by {impl.name} "
                           f"(it declares {', '.join(d for d in DTYPES if d in impl.caps.dtypes)})")
        return [only]
    return [d for d in DTYPES if d in impl.caps.dtypes]


# -- one campaign as an outcome ------------------------------------------------------------------
def _failure_text(found, rerun: str, defect=None) -> str:
    """The report with its heatmap, then where the file went and how to replay it; for one of
    a campaign's defects, how many cases hit it and what it needs."""
    lines = [found.judged.describe()]
    if defect is not None:
        lines.append(f"  cases hit: {defect.hits}; needs: {defect.needs()}"
                     + (f"; {defect.shrink_note}" if defect.shrink_note
                        else "" if defect.shrunk else "; not shrunk (as drawn)"))
    if found.written is not None:
        lines.append(f"  regression file: {display_path(found.written.path)}")
        if found.written.fallback_reason:
            lines.append(f"  (fallback location: {found.written.fallback_reason})")
        lines.append(f"  replay:  {replay_command(found.written.path, found.judged.cli_name)}")
    else:
        lines.append("  regression file: not written (saving was off)")
    lines.append(f"  found by: {rerun}")
    return "\n".join(lines)


def stop_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stop-at-first", action="store_true",
                   help="end each campaign at its first counterexample (default: go on until the "
                        "budget ends and report every distinct defect once, each shrunk and saved, "
                        "with the number of cases that hit it)")


def campaign_outcome(impl, dtype: str | None, *, profile, max_examples: int | None, seconds: float | None,
                 hypothesis_seed: int, save: bool, regressions_dir, progress, stage: str = "fuzz",
                 shrink: bool = True, isolate: bool = False, timeout: float | None = None,
                 database=None, stop_at_first: bool = False, shards: int = 1) -> Outcome:
    """Fuzz one implementation (one dtype) and describe it as an Outcome (its Campaign attached);
    `database`: the Hypothesis example database it replays and saves failures in (example_db).
    The campaign goes on after a counterexample and reports every distinct defect unless
    `stop_at_first`; an implementation whose load probe failed has that case judged first.
    A palette campaign rotates its palette (campaigns/rotation.py) by `shards`, the number of
    processes sharing the campaign, with the next palette compiled ahead where that helps."""
    from hypothesis.errors import HypothesisException
    from fuzzattn import settings
    from fuzzattn.campaigns.campaign import fuzz
    from fuzzattn.strategies.cases import attention_cases
    from fuzzattn.campaigns.compile_palette import campaign_palette

    label = f"{impl.name} {dtype or 'all dtypes'}"
    caps = impl.caps
    broken_bf16 = settings.bf16_unavailable(impl)
    if dtype == "bfloat16" and broken_bf16:
        return Outcome(stage, label, SKIP, True, detail=broken_bf16, skipped=True)
    if dtype is None and broken_bf16 and "bfloat16" in caps.dtypes and len(caps.dtypes) > 1:
        caps = dataclasses.replace(caps, dtypes=caps.dtypes - {"bfloat16"})
    palette = campaign_palette(impl, hypothesis_seed, dtype)
    try:
        rotation = None if palette is None else rotating_cases(impl, caps, dtype, profile,
                                                               palette, shards, max_examples)
        strategy = (attention_cases(caps, dtype=dtype, profile=profile) if rotation is None
                    else rotation.strategy())
        if rotation is not None:
            rotation.cases(palette)          # a bad declaration's error, before anything runs
    except HypothesisException as exc:
        return Outcome(stage, label, ERROR, False, detail=flattened(exc), message=flattened(exc))
    strategy = progress.track(strategy, f"{stage} {label}", max_examples, cap=seconds,
                              counts=_counter(impl))
    rerun = _rerun_command(impl, dtype, stage=stage, profile=profile, max_examples=max_examples,
                           seconds=seconds, hypothesis_seed=hypothesis_seed, isolate=isolate,
                           timeout=timeout, stop_at_first=stop_at_first)
    # what a watchdog needs to run this campaign again isolated, should a case end the process
    flight.set_context(hypothesis_seed=hypothesis_seed, max_examples=max_examples, seconds=seconds,
                       profile=profile.name, dtype=dtype, stage=stage,
                       regressions_dir=str(regressions_dir) if save and regressions_dir else None)
    probe = getattr(impl, "probe_case", None)
    first_cases = [probe] if probe is not None and dtype in (None, probe.dtype) else []
    start = time.perf_counter()
    try:
        # Not isolated, --timeout is the watching parent's deadline (cli/watched.py): a call in
        # this process cannot be interrupted from inside it.
        result = fuzz(impl, strategy, max_examples=max_examples, seconds=seconds,
                      hypothesis_seed_value=hypothesis_seed, save_to_file=save,
                      regressions_dir=regressions_dir, shrink=shrink, isolate=isolate,
                      timeout=timeout if isolate else None, stop_at_first=stop_at_first,
                      first_cases=first_cases, database=database,
                      database_key=example_db.key(impl.cli_name, dtype, profile.name),
                      rotation=rotation)
    except Exception as exc:   # e.g. a drawn case the harness cannot judge here: report, go on
        progress.clear()
        text = f"{type(exc).__name__}: {flattened(exc)}"
        return Outcome(stage, label, ERROR, False, seconds=time.perf_counter() - start,
                       detail=text, message=f"{text}\n  run: {rerun}")
    finally:                   # ^C and SIGTERM too: a warm-up process never outlives its campaign
        _close(rotation)
    progress.clear()
    return _described(result, stage, label, rerun, seconds, max_examples)


def rotating_cases(impl, caps, dtype: str | None, profile, palette: int, shards: int,
                   max_examples: int | None = None):
    """The rotating cases of a palette campaign numbered `palette` over `shards` processes, with
    a compile-ahead pool where compiling ahead can help (campaigns/compile_ahead.py); a campaign
    of `max_examples` cases turns often enough to see several palettes (rotation.cases_per_turn)."""
    from fuzzattn.campaigns.compile_ahead import compile_ahead
    from fuzzattn.campaigns.rotation import PaletteRotation, RotatingCases, cases_per_turn
    from fuzzattn.strategies.cases import attention_cases

    def cases(number: int):
        return attention_cases(caps, dtype=dtype, profile=profile, palette=number)
    every = cases_per_turn(max_examples)
    return RotatingCases(PaletteRotation(palette, shards, every), cases,
                         ahead=compile_ahead(impl, dtype, profile.name, every))


def _close(rotation) -> None:
    if rotation is not None and rotation.ahead is not None:
        rotation.ahead.close()


def _counter(impl):
    """The progress line's counts for `impl` from now on: (cases judged, refused, drawn)."""
    from fuzzattn.campaigns import verdicts
    judged_before, drawn_before = verdicts.judged_total, verdicts.drawn_counts[impl.name]
    refused_before = sum(n for (name, _), n in verdicts.refusal_counts.items() if name == impl.name)

    def counts():
        refused = sum(n for (name, _), n in verdicts.refusal_counts.items() if name == impl.name)
        return (verdicts.judged_total - judged_before, refused - refused_before,
                verdicts.drawn_counts[impl.name] - drawn_before)
    return counts


def _rerun_command(impl, dtype: str | None, *, stage: str, profile, max_examples: int | None,
                   seconds: float | None, hypothesis_seed: int, isolate: bool,
                   timeout: float | None, stop_at_first: bool) -> str:
    """The command that runs this campaign again as printed: an outside mutant is named by its
    spec (--only knows registered mutants only), and the run's isolation is repeated."""
    if stage == "mutant":
        command = f"mutants --impl {impl.spec}" if impl.spec else f"mutants --only {impl.name}"
    else:
        command = f"fuzz --impl {impl.cli_name} --workers 1"   # this one worker's draws
    return (f"fuzzattn {command}{' --dtype ' + dtype if dtype else ''} --hypothesis-seed "
            f"{hypothesis_seed}{' --max-examples %d' % max_examples if max_examples else ''}"
            f"{' --seconds %g' % seconds if seconds else ''} --profile {profile.name}"
            f"{' --stop-at-first' if stop_at_first and stage != 'mutant' else ''}"
            f"{isolation_flags(isolate, timeout)}")


def _described(result, stage: str, label: str, rerun: str, seconds: float | None,
               max_examples: int | None) -> Outcome:
    """The Outcome of a campaign that ran: an error, its defects, nothing judged, or a pass."""
    refusals = result.refusal_note()
    if result.error is not None:
        outcome = Outcome(stage, label, ERROR, False, result.cases, result.seconds,
                          detail=flattened(result.error), message=f"{result.error}\n  run: {rerun}")
    elif result.counterexample is not None:
        found = result.counterexample
        failure = found.judged.first_failure
        defects = result.defects or []
        detail = f"{failure.check}: {found.judged.case}"
        if len(defects) > 1:
            detail = f"{len(defects)} defects: " + ", ".join(
                f"{d.check_key} ({d.hits} case{'s' if d.hits != 1 else ''})" for d in defects)
        message = (_failure_text(found, rerun) if not defects else "\n\n".join(
            _failure_text(d.counterexample, rerun, d) for d in defects))
        outcome = Outcome(stage, label, FAIL, False, result.cases, result.seconds,
                          detail=detail, message=message, judged=found.judged)
    elif result.cases == 0 and result.budget_hit:
        # nothing was judged: a skip to see, never a pass
        outcome = Outcome(stage, label, SKIP, True, 0, result.seconds, skipped=True,
                          detail=unfuzzed(seconds))
    else:
        outcome = Outcome(stage, label, OK, True, result.cases, result.seconds)
        if result.budget_hit:
            outcome.detail = cap_reached(seconds, result.cases, max_examples)
    outcome.ended = ending(result.ended, seconds, max_examples)
    if refusals:
        loud = "MOSTLY REFUSED: " if result.mostly_refused else ""
        outcome.detail = "; ".join(filter(None, [outcome.detail, loud + refusals]))
    outcome.campaign = result
    return outcome


def cap_reached(seconds, cases: int, max_examples: int | None) -> str:
    """What a passing campaign that its time cap ended says of it."""
    of = f" of {max_examples}" if max_examples else ""
    return f"time cap {tables.seconds_text(seconds)} s reached after {cases}{of} cases"


def ending(ended: str, seconds: float | None, max_examples: int | None) -> str:
    """What ended a campaign (Campaign.ended), for a table: 'time cap 15 s', '1000 cases'."""
    if ended == "time":
        return f"time cap {tables.seconds_text(seconds)} s"
    if ended == "cases":
        return f"{max_examples} cases"
    return {"exhausted": "no new case to draw"}.get(ended, ended)


def unfuzzed(seconds) -> str:
    """Why a campaign that judged no case is a skip: its time cap ended before the first."""
    return f"not fuzzed: the time cap of {tables.seconds_text(seconds)} s ended before the first case was judged"


class Terminated(BaseException):
    """SIGTERM arrived (a BaseException, like KeyboardInterrupt: the engine turns what an
    implementation raises into verdicts, and this must not become one)."""


@contextlib.contextmanager
def stop_on_sigterm():
    """SIGTERM raises Terminated for the duration, so a command stopped from outside (a CI
    step's timeout) still reports what it did, as ^C does."""
    def handler(signum, frame):
        raise Terminated()
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:          # not the main thread (an embedding caller): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stopped_status(exc: BaseException) -> tuple[str, int]:
    """('SIGINT', 130) or ('SIGTERM', 143) for what stopped a command."""
    return ("SIGTERM", 143) if isinstance(exc, Terminated) else ("SIGINT", 130)


def print_after_table(outcomes) -> None:
    """What follows every command's table: the notes on its campaigns, then each failure's details."""
    for text in (tables.after_campaigns(outcomes), tables.failure_details(outcomes)):
        if text:
            print("\n" + text)


def finish(outcomes, last_line: str) -> int:
    """The common ending of fuzz, replay and mutants: failure details, a total, the exit status."""
    print_after_table(outcomes)
    print(f"\n{last_line}")
    return 0 if all(o.passed for o in outcomes) else 1
