"""The `fuzzattn` command: fuzz implementations, replay fixtures, self-test on mutants, and gate CI.

    fuzzattn fuzz --impl sdpa --impl path/to/mine.py:my_attention
    fuzzattn replay regressions/                     # or single fixture files
    fuzzattn mutants [--list]
    fuzzattn gate [--mutants] [--changed-since origin/main] [--junit-xml gate.xml] [--markdown gate.md]

Exit status: 0 when everything passed; 1 when something failed (a counterexample, a failing or
malformed fixture, a surviving mutant); 2 when the command could not run as asked (a bad
argument, an implementation that cannot be loaded, a bad git revision). Every status-2 problem is
one line on stderr starting with "fuzzattn: error:", never a traceback; FUZZATTN_DEBUG=1 lets an
unexpected internal error show its traceback.

`main(argv)` runs in-process (the tests call it directly), so it restores the Hypothesis profile
and FUZZATTN_PROFILE it found when it returns. Heavy imports (torch, kernels) happen inside the
commands, so `fuzzattn --help` is instant.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from . import report
from .case import DTYPES
from .fixtures import display_path
from .profiles import PROFILES
from .report import ERROR, FAIL, OK, SKIP, Outcome

# The gate's budget while Triton runs under its CPU interpreter, per campaign (one implementation
# and one dtype). Measured on the 2-core CI machine, seed 0, ci/dev shapes: the interpreted
# triton_fa2 judges 60 cases in 16-20 s per dtype when the machine is otherwise idle, torch_tiled
# and sdpa in under a second; the 9 default campaigns took 55-105 s in all. The 30 s cap bounds
# each campaign when the machine is shared (it then judges fewer cases, and says so), so the gate
# stays under ~2 minutes plus replay time. Compiled on a GPU the profile's case count applies.
GATE_INTERPRETED_EXAMPLES = 60
GATE_INTERPRETED_SECONDS = 30.0
GATE_COMPILED_SECONDS = 120.0

# Files whose change re-fuzzes every implementation under --changed-since: they decide what is
# drawn (strategies/) or how it is judged (fuzzattn/: oracle, tolerance, judge ...), or which
# versions run. The CLI's own presentation modules only change what is printed.
_PRESENTATION_ONLY = ("cli.py", "report.py")
_HARNESS_ROOT_FILES = ("pyproject.toml", "requirements-cpu.txt")


class CLIError(Exception):
    """A problem with what was asked: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors become CLIError: one line, our prefix, no usage dump."""

    def error(self, message):
        raise CLIError(message)


# -- argument types -----------------------------------------------------------------------------
def _whole_number(minimum: int, requirement: str):
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


_count = _whole_number(1, "must be at least 1")
_seed = _whole_number(0, "must not be negative")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


IMPL_METAVAR = "NAME|FILE.py:NAME|module:NAME"


def _budget_options(p: argparse.ArgumentParser, examples_help: str, seconds_help: str) -> None:
    p.add_argument("--max-examples", type=_count, metavar="N", help=examples_help)
    p.add_argument("--seconds", type=_seconds, metavar="S", help=seconds_help)
    p.add_argument("--seed", type=_seed, default=0, metavar="N",
                   help="Hypothesis seed (default 0: the same cases every run; another seed explores further)")
    p.add_argument("--profile", choices=sorted(PROFILES), metavar="P",
                   help=f"size and budget profile, one of {', '.join(sorted(PROFILES))} (default: "
                        "FUZZATTN_PROFILE, else ci under CI, gpu with CUDA, dev otherwise)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fuzzattn", description="Differential fuzz testing for attention kernels.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"fuzzattn {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = commands.add_parser("fuzz", help="fuzz implementations against the float64 oracle",
                            description="Fuzz each implementation, one campaign per declared dtype. "
                                        "Exit 1 when a counterexample is found.")
    p.add_argument("--impl", action="append", required=True, metavar=IMPL_METAVAR,
                   help="a registered implementation or mutant, or one defined outside the repo; repeatable")
    _budget_options(p, "cases per campaign (default: the profile's max_examples)",
                    "wall-time cap per campaign (default: none)")
    p.add_argument("--dtype", choices=DTYPES, metavar="D",
                   help=f"fuzz only this dtype ({', '.join(DTYPES)}); default: every declared one")
    p.add_argument("--fixtures-dir", type=Path, metavar="DIR",
                   help="where counterexamples are saved (default: FUZZATTN_FIXTURES_DIR, else the repo's regressions/)")
    p.add_argument("--no-save", action="store_true", help="do not write counterexamples as fixtures")
    p.set_defaults(run=cmd_fuzz)

    p = commands.add_parser("replay", help="replay regression fixtures",
                            description="Replay fixtures against every registered implementation "
                                        "that supports their case (or only --impl ones).")
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="fixture files or directories of *.json")
    p.add_argument("--impl", action="append", default=[], metavar=IMPL_METAVAR,
                   help="replay only against these implementations; repeatable")
    p.set_defaults(run=cmd_replay)

    p = commands.add_parser("mutants", help="check that the fuzzer catches every seeded bug",
                            description="Run the default campaign against each mutant; exit 1 if any survives.")
    p.add_argument("--list", action="store_true", help="list the mutants and the bug each plants")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="run only these mutants; repeatable")
    p.add_argument("--impl", action="append", default=[], metavar="FILE.py:NAME|module:NAME",
                   help="a seeded-bug variant of your own kernel, kept outside the repo, to run "
                        "as a mutant (instead of the zoo unless --only is also given); repeatable")
    p.add_argument("--shrink", action="store_true",
                   help="shrink each mutant's first failing case (minutes per mutant under the interpreter)")
    _budget_options(p, "cases per mutant (default: the profile's max_examples)",
                    "wall-time cap per mutant (default: none)")
    p.set_defaults(run=cmd_mutants)

    p = commands.add_parser("gate", help="replay fixtures, fuzz within a budget, optionally self-test on mutants",
                            description="The CI gate: (1) replay regressions/ on every supporting "
                                        "implementation, (2) fuzz every registered implementation, "
                                        "(3) with --mutants, the mutant self-test. Exit 0 only when all pass.")
    _budget_options(p, f"cases per campaign (default: {GATE_INTERPRETED_EXAMPLES} while Triton is "
                       "interpreted, else the profile's max_examples)",
                    f"wall-time cap per campaign (default: {GATE_INTERPRETED_SECONDS:g} interpreted, "
                    f"{GATE_COMPILED_SECONDS:g} compiled)")
    p.add_argument("--mutants", action="store_true",
                   help="also run the mutant self-test (first failing cases, not shrunk)")
    p.add_argument("--changed-since", metavar="REV",
                   help="fuzz only implementations whose source files changed since REV (all of them "
                        "if the harness changed); the rest are only replayed")
    p.add_argument("--junit-xml", type=Path, metavar="PATH", help="write a JUnit XML report")
    p.add_argument("--markdown", type=Path, metavar="PATH", help="write a markdown summary")
    p.add_argument("--fixtures-dir", type=Path, metavar="DIR",
                   help="fixtures to replay and where new ones go (default: FUZZATTN_FIXTURES_DIR, else the repo's regressions/)")
    p.add_argument("--impl", action="append", default=[], metavar="FILE.py:NAME",
                   help="also replay and fuzz an implementation defined outside the repo; repeatable")
    p.set_defaults(run=cmd_gate)
    return parser


# -- entry point --------------------------------------------------------------------------------
def _one_line(text) -> str:
    return " ".join(str(text).split())


@contextlib.contextmanager
def _profile_restored():
    """Put back the Hypothesis profile and FUZZATTN_PROFILE: main() may run inside pytest."""
    from hypothesis import settings
    getter = getattr(settings, "get_current_profile_name", None)
    name = getter() if getter else getattr(settings, "_current_profile", None)
    env = os.environ.get("FUZZATTN_PROFILE")
    try:
        yield
    finally:
        if name:
            with contextlib.suppress(Exception):
                settings.load_profile(name)
        if env is None:
            os.environ.pop("FUZZATTN_PROFILE", None)
        else:
            os.environ["FUZZATTN_PROFILE"] = env


@contextlib.contextmanager
def _one_cpu_thread():
    """Run torch single-threaded on a CPU-only machine, unless OMP_NUM_THREADS says otherwise.

    Fuzzed cases are tiny (sequences up to ~80), so intra-op threads buy nothing, and when
    another process holds a core the threads stall at their barriers: measured on the 2-core
    machine, 60 torch_tiled cases took 0.45 s single-threaded every time but 8-13 s about one run
    in three with torch's default two threads.
    """
    import torch
    before = torch.get_num_threads()
    pin = not torch.cuda.is_available() and "OMP_NUM_THREADS" not in os.environ
    if pin:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if pin:
            torch.set_num_threads(before)


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except CLIError as exc:
        print(f"fuzzattn: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except SystemExit as exc:          # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    with _profile_restored(), _one_cpu_thread(), warnings.catch_warnings():
        # numpy's divide/overflow warnings from inside Triton's interpreter: a kernel's NaN or inf
        # is judged as a verdict (nonfinite, out_of_bounds_read ...), the warning only adds noise.
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
        warnings.filterwarnings("ignore", message="Conversion of an array with ndim > 0 to a scalar",
                                category=DeprecationWarning)
        try:
            _choose_backend()
            return args.run(args)
        except CLIError as exc:
            print(f"fuzzattn: error: {_one_line(exc)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("\nfuzzattn: error: interrupted", file=sys.stderr)
            return 130
        except Exception as exc:
            if os.environ.get("FUZZATTN_DEBUG"):
                raise
            print(f"fuzzattn: error: internal error: {type(exc).__name__}: {_one_line(exc)} "
                  "(FUZZATTN_DEBUG=1 shows the traceback)", file=sys.stderr)
            return 2


# -- shared helpers -----------------------------------------------------------------------------
def _choose_backend() -> None:
    """Set up Triton (interpreter on CPU, bf16 repairs) before an outside --impl file can import
    it, turning a broken setup (numpy too new for triton 3.6's interpreter) into one line."""
    from .interpreter import ensure_backend
    try:
        ensure_backend()
    except Exception as exc:       # e.g. numpy too new for triton 3.6's interpreter
        raise CLIError(f"cannot set up the Triton backend: {_one_line(exc)}") from None


def _load_profile(name):
    from . import profiles
    try:
        return profiles.load(name)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def _resolve(spec: str):
    """A registered implementation or mutant by name, or an outside one by FILE.py:NAME."""
    from .loader import ImplementationLoadError, load_implementation
    from .registry import UnknownImplementationError, get
    try:
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


def _triton_interpreted() -> bool:
    from .interpreter import is_interpreted
    return is_interpreted()


def _bf16_unavailable(impl) -> str | None:
    """Why bf16 cannot be judged for this implementation here (a broken interpreter dot), or None."""
    if impl.backend != "triton":
        return None
    from .interpreter import bf16_dot_status
    ok, reason = bf16_dot_status()
    return None if ok else reason


def _finish(outcomes, last_line: str) -> int:
    """The common ending of fuzz, replay and mutants: failure details, a total, the exit status."""
    details = report.failure_details(outcomes)
    if details:
        print("\n" + details)
    print(f"\n{last_line}")
    return 0 if all(o.passed for o in outcomes) else 1


@dataclasses.dataclass
class _Campaign:
    """One campaign's outcome plus what the fuzz and mutants tables show beside it."""
    outcome: Outcome
    impl: str
    dtype: str
    result: object = None       # CampaignResult, when the campaign ran


def _failure_text(found, spec: str, rerun: str) -> str:
    """The report with its heatmap, then where the fixture went and how to replay it."""
    from .fixtures import Fixture
    lines = [found.report.describe()]
    if found.fixture_path is not None:
        fixture = Fixture(case=found.report.case, path=found.fixture_path)
        lines.append(f"  fixture: {display_path(found.fixture_path)}")
        lines.append(f"  replay:  {fixture.replay_command()} --impl {spec}")
    else:
        lines.append("  fixture: not written (saving was off)")
    lines.append(f"  found by: {rerun}")
    return "\n".join(lines)


def _run_campaign(impl, spec: str, dtype: str | None, *, profile, max_examples: int,
                  seconds: float | None, seed: int, save: bool, fixtures_dir, progress,
                  stage: str = "fuzz", shrink: bool = True) -> _Campaign:
    from hypothesis.errors import HypothesisException
    from strategies.cases import attention_cases
    from .campaign import fuzz

    label = f"{impl.name} {dtype or 'all dtypes'}"
    caps = impl.caps
    broken_bf16 = _bf16_unavailable(impl)
    if dtype == "bfloat16" and broken_bf16:
        return _Campaign(Outcome(stage, label, SKIP, True, detail=broken_bf16, skipped=True),
                         impl.name, dtype)
    if dtype is None and broken_bf16 and "bfloat16" in caps.dtypes and len(caps.dtypes) > 1:
        caps = dataclasses.replace(caps, dtypes=caps.dtypes - {"bfloat16"})
    try:
        strategy = attention_cases(caps, dtype=dtype, profile=profile)
    except HypothesisException as exc:
        return _Campaign(Outcome(stage, label, ERROR, False, detail=_one_line(exc),
                                 message=_one_line(exc)), impl.name, dtype or "")
    strategy = progress.track(strategy, f"{stage} {label}", max_examples)
    rerun = (f"fuzzattn {'mutants --only ' + impl.name if stage == 'mutant' else 'fuzz --impl ' + spec}"
             f"{' --dtype ' + dtype if dtype else ''} --seed {seed} --max-examples {max_examples}"
             f"{' --seconds %g' % seconds if seconds else ''} --profile {profile.name}")
    start = time.perf_counter()
    try:
        result = fuzz(impl, strategy, max_examples=max_examples, seconds=seconds, seed=seed,
                      save=save, fixtures_dir=fixtures_dir, shrink=shrink)
    except Exception as exc:   # e.g. a drawn case the harness cannot judge here: report, go on
        progress.clear()
        text = f"{type(exc).__name__}: {_one_line(exc)}"
        return _Campaign(Outcome(stage, label, ERROR, False, seconds=time.perf_counter() - start,
                                 detail=text, message=f"{text}\n  run: {rerun}"), impl.name, dtype or "")
    progress.clear()
    if result.error is not None:
        outcome = Outcome(stage, label, ERROR, False, result.cases, result.seconds,
                          detail=_one_line(result.error), message=f"{result.error}\n  run: {rerun}")
    elif result.counterexample is not None:
        found = result.counterexample
        failure = found.report.first_failure
        outcome = Outcome(stage, label, FAIL, False, result.cases, result.seconds,
                          detail=f"{failure.check}: {found.report.case}",
                          message=_failure_text(found, spec, rerun))
    else:
        outcome = Outcome(stage, label, OK, True, result.cases, result.seconds)
        if result.budget_hit:
            outcome.detail = f"time cap {seconds:g} s reached after {result.cases} of {max_examples} cases"
    return _Campaign(outcome, impl.name, dtype or "", result)


def _dtypes(impl, only: str | None) -> list[str]:
    if only is not None:
        if only not in impl.caps.dtypes:
            raise CLIError(f"--dtype {only} is not declared by {impl.name} "
                           f"(it declares {', '.join(d for d in DTYPES if d in impl.caps.dtypes)})")
        return [only]
    return [d for d in DTYPES if d in impl.caps.dtypes]


# -- fuzz ---------------------------------------------------------------------------------------
def cmd_fuzz(args) -> int:
    from .fixtures import default_dir
    profile = _load_profile(args.profile)
    subjects = [(_resolve(spec), spec) for spec in args.impl]
    plan = [(impl, spec, dtype) for impl, spec in subjects for dtype in _dtypes(impl, args.dtype)]
    max_examples = args.max_examples or profile.max_examples
    fixtures_dir = args.fixtures_dir or default_dir()
    progress = report.Progress()
    runs = [_run_campaign(impl, spec, dtype, profile=profile, max_examples=max_examples,
                          seconds=args.seconds, seed=args.seed, save=not args.no_save,
                          fixtures_dir=fixtures_dir, progress=progress)
            for impl, spec, dtype in plan]

    print(f"fuzzattn fuzz: profile={profile.name} seed={args.seed} max_examples={max_examples}"
          f"{' seconds=%g' % args.seconds if args.seconds else ''}")
    rows = []
    for run in runs:
        found = run.result.counterexample if run.result is not None else None
        rows.append([run.impl, run.dtype, run.outcome.verdict, run.outcome.cases,
                     report.seconds(run.outcome.seconds),
                     "" if run.result is None or run.result.cases_to_first_failure is None
                     else run.result.cases_to_first_failure,
                     found.report.first_failure.check if found else "",
                     str(found.report.case) if found else run.outcome.detail])
    print(report.table(("impl", "dtype", "verdict", "cases", "seconds", "first failure at",
                        "check", "shrunk case / detail"), rows, max_width=90))
    outcomes = [run.outcome for run in runs]
    return _finish(outcomes, report.totals(outcomes))


# -- replay -------------------------------------------------------------------------------------
def _fixture_paths(paths) -> list[Path]:
    from .fixtures import discover
    found = []
    for path in paths:
        if path.is_dir():
            found += [p for p in discover(path) if not p.name.startswith(".")]
        elif path.exists():
            found.append(path)
        else:
            raise CLIError(f"{path}: no such file or directory")
    seen, unique = set(), []
    for path in found:              # a file also named through its folder is replayed once
        if path.resolve() not in seen:
            seen.add(path.resolve())
            unique.append(path)
    return unique


@dataclasses.dataclass
class _Replay:
    fixture: str
    impl: str
    check: str
    numbers: str
    outcome: Outcome


def _replay_all(paths, subjects, *, only_given: bool, progress) -> list[_Replay]:
    """Replay each fixture on each supporting subject; a bad fixture is one failing row."""
    from .fixtures import FixtureError, load
    from .replay import replay_one
    rows = []
    for n, path in enumerate(paths, 1):
        name = path.name
        progress.status(f"replay {n}/{len(paths)} {name}")
        try:
            fixture = load(path)
        except FixtureError as exc:
            text = _one_line(exc)
            rows.append(_Replay(name, "-", "malformed", "", Outcome(
                "replay", name, FAIL, False, detail=text, message=text)))
            continue
        targets = [(impl, spec) for impl, spec in subjects if only_given or impl.supports(fixture.case)]
        if not targets:
            rows.append(_Replay(name, "-", "", "", Outcome(
                "replay", name, SKIP, True, skipped=True,
                detail=f"no implementation declares {fixture.case}")))
        for impl, spec in targets:
            subject = f"{name} on {impl.name}"
            why = impl.caps.why_not(fixture.case)
            if why is not None:       # named with --impl but outside its declaration
                rows.append(_Replay(name, impl.name, "", "", Outcome(
                    "replay", subject, SKIP, True, skipped=True,
                    detail=f"{impl.name} does not declare {why}")))
                continue
            start = time.perf_counter()
            result = replay_one(fixture, impl)
            took = time.perf_counter() - start
            failure = result.report.first_failure if result.report is not None else None
            numbers = (f"{failure.error:.3g} / {failure.allowed:.3g}"
                       if failure is not None and failure.error is not None
                       and failure.allowed is not None else "")
            if result.skipped:      # the reason judge gave, without the fixture header
                reason = result.report.skipped
                outcome = Outcome("replay", subject, SKIP, True, seconds=took, skipped=True,
                                  detail=_one_line(reason))
            elif result.passed:
                outcome = Outcome("replay", subject, OK, True, seconds=took)
            else:
                verdict = "inputs_drifted" if result.check == "inputs_drifted" else FAIL
                message = result.message
                if spec != impl.name and "--impl" in message:
                    message = message.replace(f"--impl {impl.name}", f"--impl {spec}")
                outcome = Outcome("replay", subject, verdict, False, seconds=took,
                                  detail=f"{result.check}" + (f" {numbers}" if numbers else ""),
                                  message=message)
            rows.append(_Replay(name, impl.name, result.check, numbers, outcome))
    progress.clear()
    return rows


def _registered_subjects():
    from .registry import implementations
    return [(impl, impl.name) for impl in implementations().values()]


def cmd_replay(args) -> int:
    paths = _fixture_paths(args.paths)
    given = [(_resolve(spec), spec) for spec in args.impl]
    subjects = given or _registered_subjects()
    if not paths:
        print(f"no fixtures under {', '.join(str(p) for p in args.paths)}")
        return 0
    rows = _replay_all(paths, subjects, only_given=bool(given), progress=report.Progress())
    print(report.table(("fixture", "impl", "verdict", "check", "error / allowed", "detail"),
                       [[r.fixture, r.impl, r.outcome.verdict, r.check, r.numbers,
                         r.outcome.detail if r.outcome.verdict in (SKIP,) or r.check == "malformed"
                         else ""] for r in rows], max_width=100))
    outcomes = [r.outcome for r in rows]
    return _finish(outcomes, f"{len(paths)} fixture(s): {report.totals(outcomes)}")


# -- mutants ------------------------------------------------------------------------------------
def _select_mutants(only) -> list:
    from .registry import mutants
    zoo = mutants()
    unknown = [name for name in only if name not in zoo]
    if unknown:
        raise CLIError(f"--only {unknown[0]!r} is not a mutant (mutants: {', '.join(sorted(zoo)) or 'none'})")
    return [zoo[name] for name in only] if only else list(zoo.values())


def _run_mutants(selected, *, profile, max_examples, seconds, seed, progress,
                 shrink: bool = False) -> list[_Campaign]:
    # save=False already keeps fixtures out of regressions/; the temporary directory makes sure a
    # seeded bug can never leave a fixture behind even if saving were switched on.
    # Without --shrink the first failing case is reported: a mutant only has to be caught, and
    # Hypothesis draws its simplest cases first (measured: mutant_lse_base2 failed on its first
    # case, then shrank for 190 s under the interpreter).
    with tempfile.TemporaryDirectory(prefix="fuzzattn-mutants-") as scratch:
        runs = []
        for mutant in selected:
            run = _run_campaign(mutant, mutant.name, None, profile=profile, max_examples=max_examples,
                                seconds=seconds, seed=seed, save=False, fixtures_dir=scratch,
                                progress=progress, stage="mutant", shrink=shrink)
            run.outcome.subject = mutant.name
            if run.outcome.verdict == FAIL:           # a counterexample: the mutant is caught
                run.outcome.verdict, run.outcome.passed = "killed", True
            elif run.outcome.verdict == OK:
                run.outcome.verdict, run.outcome.passed = "SURVIVED", False
                run.outcome.detail = f"no failure in {run.outcome.cases} cases; plants: {mutant.description}"
                run.outcome.message = run.outcome.detail
            runs.append(run)
    return runs


def _mutation_score(runs) -> str:
    killed = sum(r.outcome.verdict == "killed" for r in runs)
    pct = f" ({100 * killed / len(runs):.0f}%)" if runs else ""
    return f"mutation score: {killed}/{len(runs)} killed{pct}"


def cmd_mutants(args) -> int:
    outside = [_resolve(spec) for spec in args.impl]
    selected = (_select_mutants(args.only) if args.only or not outside else []) + outside
    if args.list:
        if not selected:
            print("no mutants registered (kernels/mutants: MUTANTS is empty)")
            return 0
        print(report.table(("mutant", "mutant of", "plants"),
                           [[m.name, m.mutant_of or "", m.description] for m in selected], max_width=110))
        return 0
    profile = _load_profile(args.profile)
    if not selected:
        print("no mutants registered (kernels/mutants: MUTANTS is empty); nothing to run")
        return 0
    max_examples = args.max_examples or profile.max_examples
    runs = _run_mutants(selected, profile=profile, max_examples=max_examples, seconds=args.seconds,
                        seed=args.seed, progress=report.Progress(), shrink=args.shrink)
    print(f"fuzzattn mutants: profile={profile.name} seed={args.seed} max_examples={max_examples}"
          f"{' seconds=%g' % args.seconds if args.seconds else ''}")
    rows = []
    for run in runs:
        found = run.result.counterexample if run.result is not None else None
        rows.append([run.impl, run.outcome.verdict,
                     "" if run.result is None or run.result.cases_to_first_failure is None
                     else run.result.cases_to_first_failure,
                     report.seconds(run.outcome.seconds),
                     found.report.first_failure.check if found else "",
                     str(found.report.case) if found else run.outcome.detail])
    print(report.table(("mutant", "killed", "cases to first failure", "seconds", "caught by",
                        f"{'shrunk' if args.shrink else 'first failing'} case / detail"), rows, max_width=90))
    return _finish([r.outcome for r in runs], _mutation_score(runs))


# -- gate ---------------------------------------------------------------------------------------
def _git(args, cwd) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True)
    except FileNotFoundError:
        raise CLIError("--changed-since needs git, which is not installed") from None


def _repo_root() -> Path:
    """The git work tree holding this fuzzattn checkout, else the one around the cwd."""
    for candidate in (Path(__file__).resolve().parent.parent, Path.cwd()):
        done = _git(["rev-parse", "--show-toplevel"], candidate)
        if done.returncode == 0:
            return Path(done.stdout.decode().strip())
    raise CLIError("--changed-since needs a git repository, and neither the fuzzattn checkout "
                   "nor the current directory is in one")


def changed_files(rev: str) -> set[Path]:
    """Absolute paths changed between REV and the working tree, plus untracked (new) files."""
    if rev.startswith("-"):
        raise CLIError(f"--changed-since {rev!r} is not a revision")
    root = _repo_root()
    done = _git(["diff", "--name-only", "-z", rev, "--"], root)
    if done.returncode != 0:
        why = (done.stderr.decode(errors="replace").strip().splitlines() or ["git diff failed"])[0]
        raise CLIError(f"--changed-since {rev!r}: {why}")
    names = done.stdout.decode().split("\0")
    # A new implementation that is not committed yet is changed too.
    untracked = _git(["ls-files", "--others", "--exclude-standard", "-z"], root)
    if untracked.returncode == 0:
        names += untracked.stdout.decode().split("\0")
    return {(root / name).resolve() for name in names if name}


def _harness_files(changed: set[Path]) -> list[Path]:
    import strategies
    package = Path(__file__).resolve().parent
    roots = [package, Path(strategies.__file__).resolve().parent]
    extra = {(package.parent / name).resolve() for name in _HARNESS_ROOT_FILES}
    hits = []
    for path in sorted(changed):
        if path in extra:
            hits.append(path)
        elif any(path.is_relative_to(r) for r in roots) and not (
                path.parent == package and path.name in _PRESENTATION_ONLY):
            hits.append(path)
    return hits


def _gate_plan(args, subjects) -> tuple[set[str], list[str]]:
    """Which subjects get a fuzzing budget, and a note saying why."""
    names = {impl.name for impl, _ in subjects}
    if not args.changed_since:
        return names, []
    changed = changed_files(args.changed_since)
    harness = _harness_files(changed)
    if harness:
        shown = ", ".join(display_path(p) for p in harness[:3]) + (" ..." if len(harness) > 3 else "")
        return names, [f"harness changed since {args.changed_since} ({shown}): fuzzing every implementation"]
    chosen = set()
    for impl, spec in subjects:
        outside = spec != impl.name            # named with --impl: the user asked for it
        if outside or any(Path(f).resolve() in changed for f in impl.source_files()):
            chosen.add(impl.name)
    listed = ", ".join(sorted(chosen)) or "none"
    return chosen, [f"changed since {args.changed_since}: fuzzing {listed}; the others are replayed only"]


def cmd_gate(args) -> int:
    from .fixtures import default_dir, discover
    started = time.perf_counter()
    profile = _load_profile(args.profile)
    extras = [(_resolve(spec), spec) for spec in args.impl]
    subjects = _registered_subjects() + extras
    to_fuzz, notes = _gate_plan(args, subjects)       # a bad REV stops here, before any work
    interpreted = _triton_interpreted()
    max_examples = args.max_examples or (GATE_INTERPRETED_EXAMPLES if interpreted else profile.max_examples)
    seconds = args.seconds or (GATE_INTERPRETED_SECONDS if interpreted else GATE_COMPILED_SECONDS)
    fixtures_dir = args.fixtures_dir or default_dir()
    progress = report.Progress()
    header = (f"fuzzattn gate: profile={profile.name} seed={args.seed} budget={max_examples} cases / "
              f"{seconds:g} s per campaign; triton {'interpreted' if interpreted else 'compiled'}; "
              f"fixtures {display_path(fixtures_dir)}")

    # (1) every known bug stays fixed, on every implementation that can run its case
    paths = [p for p in discover(fixtures_dir) if not p.name.startswith(".")]
    outcomes = [r.outcome for r in _replay_all(paths, subjects, only_given=False, progress=progress)]

    # (2) look for new bugs; counterexamples become fixtures for step (1) next time
    for impl, spec in subjects:
        if impl.name not in to_fuzz:
            outcomes.append(Outcome("fuzz", impl.name, SKIP, True, skipped=True,
                                    detail=f"unchanged since {args.changed_since}: replayed only"))
            continue
        for dtype in _dtypes(impl, None):
            outcomes.append(_run_campaign(impl, spec, dtype, profile=profile, max_examples=max_examples,
                                          seconds=seconds, seed=args.seed, save=True,
                                          fixtures_dir=fixtures_dir, progress=progress).outcome)

    # (3) the fuzzer still catches every seeded bug
    if args.mutants:
        selected = _select_mutants([])
        runs = _run_mutants(selected, profile=profile, max_examples=max_examples, seconds=seconds,
                            seed=args.seed, progress=progress)
        outcomes += [r.outcome for r in runs]
        notes.append(_mutation_score(runs) if runs else "no mutants registered")

    wall = time.perf_counter() - started
    notes.append(f"{len(paths)} fixture(s) replayed; wall time {wall:.0f} s")
    print(header)
    for note in notes:
        print(note)
    print(report.summary_table(outcomes))
    details = report.failure_details(outcomes)
    if details:
        print("\n" + details)
    passed = all(o.passed for o in outcomes)
    print(f"\ngate {'passed' if passed else 'FAILED'}: {report.totals(outcomes)} in {wall:.0f} s")
    if args.junit_xml:
        report.write_text(args.junit_xml, report.junit_xml(outcomes))
        print(f"JUnit XML: {args.junit_xml}")
    if args.markdown:
        report.write_text(args.markdown, report.markdown(outcomes, notes=[header] + notes))
        print(f"markdown summary: {args.markdown}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
