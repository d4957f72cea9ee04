"""`fuzzattn mutants`: the default campaigns against each seeded-bug variant; exit 1 if any survives.

A mutant gets one campaign per declared dtype, as the differential tests and `fuzz` run them,
each with the full case budget, in the declared order (fp32, bf16, fp16); the first campaign that
catches it ends its run. A precision bug planted for one dtype (an fp16 accumulator) can only
show on cases of that dtype, so a single campaign over all dtypes would spend two thirds of its
budget where the bug cannot be seen, and its cases-to-kill would measure the dtype draw, not the
checks. "cases to kill" is counted within the campaign that caught the mutant; the campaigns
before it are reported beside it (the dtype column and the total cases judged).

`--profiles ci,gpu` runs the zoo under each profile in turn: a table each, then the cases to
kill of every profile side by side, and the median / 90th percentile / max per profile."""
from __future__ import annotations

import math
import statistics
import tempfile
import time

from fuzzattn.campaigns.outcome import FAIL, KILLED, OK, SKIP, SURVIVED, Outcome
from fuzzattn.cli import common, tables
from fuzzattn.contract.dtypes import DTYPES


def add_parser(commands) -> None:
    p = commands.add_parser("mutants", help="check that the fuzzer catches every seeded bug",
                            description="Run the default campaign against each mutant; exit 1 if any survives.")
    p.add_argument("--list", action="store_true", help="list the mutants and the bug each plants")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="run only these mutants; repeatable")
    p.add_argument("--impl", action="append", default=[], metavar="FILE.py:NAME|module:NAME",
                   help="a seeded-bug variant of your own kernel, kept outside the repo, to run "
                        "as a mutant (instead of the zoo unless --only is also given); repeatable")
    p.add_argument("--dtype", choices=DTYPES, help="run only this dtype's campaign (default: one "
                   "campaign per declared dtype, stopping at the first that catches the mutant)")
    p.add_argument("--shrink", action="store_true",
                   help="shrink each mutant's first failing case (minutes per mutant under the interpreter)")
    common.budget_options(p, "cases per mutant (default: the profile's max_examples)",
                          "wall-time cap per mutant (default: none)")
    p.add_argument("--profiles", type=_profile_list, metavar="P,P",
                   help="run the zoo under each of these profiles in turn (e.g. ci,gpu) and "
                        "report the cases to kill under each side by side (default: --profile's)")
    common.isolation_options(p)
    p.set_defaults(run=run)


def _profile_list(text: str) -> list[str]:
    import argparse
    from fuzzattn.contract.profiles import PROFILES
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PROFILES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"--profiles {text!r}: each must be one of {', '.join(sorted(PROFILES))}")
    return list(dict.fromkeys(names))


def select(only) -> list:
    from fuzzattn.run.registry import mutants
    zoo = mutants()
    unknown = [name for name in only if name not in zoo]
    if unknown:
        raise common.CLIError(f"--only {unknown[0]!r} is not a mutant (mutants: {', '.join(sorted(zoo)) or 'none'})")
    return [zoo[name] for name in only] if only else list(zoo.values())


def run_mutants(selected, *, profile, max_examples, seconds, hypothesis_seed, progress,
                shrink: bool = False, isolate: bool = False, timeout: float | None = None,
                dtype: str | None = None, mutant_seconds: float | None = None) -> list:
    """One row per mutant. `seconds` caps each dtype campaign; `mutant_seconds` (the command's
    --seconds) caps a mutant's campaigns together instead, shared as `_share` says."""
    # save=False already keeps files out of regressions/; the temporary directory makes sure a
    # seeded bug can never leave a file behind even if saving were switched on.
    # Without --shrink the first failing case is reported: a mutant only has to be caught, and
    # Hypothesis draws its simplest cases first (measured: mutant_lse_base2 failed on its first
    # case, then shrank for 190 s under the interpreter).
    with tempfile.TemporaryDirectory(prefix="fuzzattn-mutants-") as scratch:
        outcomes = []
        for mutant in selected:
            runs = []
            declared = common.dtypes_of(mutant, None)
            dtypes = [dtype] if dtype in declared else [] if dtype else list(declared)
            started = time.monotonic()
            for i, one in enumerate(dtypes):
                o = common.campaign_outcome(mutant, one, profile=profile, max_examples=max_examples,
                                        seconds=seconds if mutant_seconds is None else
                                        _share(mutant_seconds, started, len(dtypes) - i),
                                        hypothesis_seed=hypothesis_seed,
                                        save=False, regressions_dir=scratch, progress=progress,
                                        stage="mutant", shrink=shrink, isolate=isolate,
                                        timeout=timeout, stop_at_first=True)
                o.dtype = one
                runs.append(o)
                if o.verdict != OK and not o.skipped:   # caught, or the campaign broke: stop
                    break
            outcomes.append(_mutant_outcome(mutant, runs))
    return outcomes


def _share(seconds: float, started: float, campaigns_left: int) -> float:
    """A dtype campaign's part of the mutant's wall-time cap: what is left of it, shared by the
    campaigns left, so a bug only one dtype shows is still reached when an earlier dtype's
    campaign runs to its share (what an earlier campaign leaves passes on)."""
    return max(seconds - (time.monotonic() - started), 0.001) / campaigns_left


def _mutant_outcome(mutant, runs):
    """One row per mutant from its dtype campaigns: the last one run (the catching one, if any)."""
    if not runs:                    # --dtype names a dtype this mutant does not declare
        return Outcome("mutant", mutant.name, SKIP, True, skipped=True,
                       detail="declares none of the dtypes asked for")
    o = runs[-1]
    o.subject = mutant.name
    o.total_cases = sum(r.cases or 0 for r in runs)
    o.seconds = sum(r.seconds or 0.0 for r in runs)
    if o.verdict == FAIL:           # a counterexample: the mutant is caught
        o.verdict, o.passed = KILLED, True
    elif o.verdict in (OK, SKIP) and all(r.verdict in (OK, SKIP) for r in runs):
        tried = ", ".join(f"{r.dtype} {r.cases or 0}" for r in runs if not r.skipped)
        o.verdict, o.passed, o.skipped = SURVIVED, False, False
        o.dtype = ""
        o.detail = f"no failure in {tried} cases; plants: {mutant.description}"
        o.message = o.detail
    return o


def _bounded(verdict) -> bool:
    return verdict.error is not None and verdict.allowed is not None


def _ratio(verdict) -> float:
    if verdict.allowed == 0:
        return math.inf
    return verdict.error / verdict.allowed


def catching(judged):
    """The failing check of a killing case that is furthest past its bound: one without a bound
    (a crash, a non-finite value, a canary ...) if any failed, else the largest error / allowed.
    A mutant is one tolerance change from surviving only if every check that failed was near its
    bound, so this, not the first check in the judge's order, says how firmly it was caught."""
    fails = judged.failures
    if not fails:
        return None
    unbounded = [v for v in fails if not _bounded(v)]
    return unbounded[0] if unbounded else max(fails, key=_ratio)


def margin(verdict) -> str:
    """How far past its bound the catching check was: error / allowed (e.g. '3.1e+04x'), so a
    mutant caught by a hair (a ratio near 1, one tolerance change from surviving) stands out.
    Checks without a bound (crash, nonfinite, a canary ...) are not a matter of degree: '-'."""
    if verdict is None or not _bounded(verdict):
        return "-"
    ratio = _ratio(verdict)
    return "inf" if math.isinf(ratio) else f"{ratio:.3g}x"


def mutation_score(outcomes) -> str:
    killed = sum(o.verdict == KILLED for o in outcomes)
    pct = f" ({100 * killed / len(outcomes):.0f}%)" if outcomes else ""
    return f"mutation score: {killed}/{len(outcomes)} killed{pct}"


def cases_to_kill(outcome) -> int | None:
    """Cases to the first failure in the dtype campaign that caught the mutant (None: not killed)."""
    if outcome.verdict != KILLED or outcome.campaign is None:
        return None
    return outcome.campaign.cases_to_first_failure


def kill_speed(outcomes) -> str:
    """Cases to the first failure (in the dtype campaign that caught it) over the killed
    mutants: median, 90th percentile, max."""
    counts = sorted(n for n in map(cases_to_kill, outcomes) if n is not None)
    if not counts:
        return ""
    p90 = counts[min(len(counts) - 1, int(0.9 * len(counts)))]
    return (f"cases to kill: median {statistics.median(counts):g}, 90th percentile {p90}, "
            f"max {counts[-1]} (over {len(counts)} killed)")


def run(args) -> int:
    isolate, timeout = common.isolation(args)
    outside = [common.resolve(spec, isolate, timeout) for spec in args.impl]
    selected = (select(args.only) if args.only or not outside else []) + outside
    if args.list:
        if not selected:
            print("no mutants registered (kernels/mutants: MUTANTS is empty)")
            return 0
        print(tables.table(("mutant", "mutant of", "plants"),
                           [[m.name, m.mutant_of or "", m.description] for m in selected], max_width=110))
        return 0
    if not selected:
        common.load_profile(args.profile)
        print("no mutants registered (kernels/mutants: MUTANTS is empty); nothing to run")
        return 0
    by_profile = {}
    for name in args.profiles or [args.profile]:
        profile = common.load_profile(name)
        max_examples = args.max_examples or profile.max_examples
        outcomes = run_mutants(selected, profile=profile, max_examples=max_examples,
                               seconds=None, mutant_seconds=args.seconds,
                               hypothesis_seed=args.hypothesis_seed,
                               progress=tables.Progress(), shrink=args.shrink, isolate=isolate,
                               timeout=timeout, dtype=args.dtype)
        print(f"fuzzattn mutants: profile={profile.name} hypothesis_seed={args.hypothesis_seed} "
              f"max_examples={max_examples} per dtype campaign"
              f"{' seconds=%g per mutant' % args.seconds if args.seconds else ''}"
              f"{' isolated' if isolate else ''}{' timeout=%g' % timeout if timeout else ''}")
        _print_table(outcomes, args.shrink)
        by_profile[profile.name] = outcomes
    if len(by_profile) > 1:
        print("\ncases to kill by profile:")
        print(tables.table(["mutant"] + list(by_profile),
                           [[m.name] + [_kill_cell(outcomes[i]) for outcomes in by_profile.values()]
                            for i, m in enumerate(selected)]))
    summaries = {name: mutation_score(outcomes) + (f"; {kill_speed(outcomes)}"
                                                   if kill_speed(outcomes) else "")
                 for name, outcomes in by_profile.items()}
    summary = (next(iter(summaries.values())) if len(summaries) == 1 else
               "\n".join(f"{name}: {line}" for name, line in summaries.items()))
    return common.finish([o for outcomes in by_profile.values() for o in outcomes], summary)


def _kill_cell(outcome) -> str:
    n = cases_to_kill(outcome)
    if n is None:
        return outcome.verdict
    return f"{n} ({DTYPE_SHORT.get(getattr(outcome, 'dtype', ''), '')})"


DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _print_table(outcomes, shrink: bool) -> None:
    rows = []
    for o in outcomes:
        campaign = o.campaign
        found = campaign.counterexample if campaign is not None else None
        caught = catching(found.judged) if found else None
        rows.append([o.subject, o.verdict, getattr(o, "dtype", "") if found else "",
                     "" if campaign is None or campaign.cases_to_first_failure is None
                     else campaign.cases_to_first_failure,
                     getattr(o, "total_cases", o.cases),
                     tables.seconds(o.seconds),
                     caught.check if caught else "",
                     margin(caught) if found else "",
                     str(found.judged.case) if found else o.detail])
    print(tables.table(("mutant", "killed", "dtype", "cases to kill", "cases judged", "seconds",
                        "caught by", "margin (error / allowed)",
                        f"{'shrunk' if shrink else 'first failing'} case / detail"),
                       rows, max_width=90))
    # The table cuts the case; a configuration-only bug is read from its configuration in full.
    configured = [(o.subject, o.campaign.counterexample.judged.case) for o in outcomes
                  if o.campaign is not None and o.campaign.counterexample is not None
                  and o.campaign.counterexample.judged.case.config]
    if configured:
        print("\nconfiguration of each failing case:")
        for name, case in configured:
            print(f"  {name}: " + " ".join(f"{key}={value}" for key, value in case.config))
