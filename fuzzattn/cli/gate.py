"""`fuzzattn gate`: the pre-merge gate. (1) replay every regression file on every implementation
that supports it, (2) fuzz every implementation within a budget, saving what it finds, (3) with
--mutants, check that every seeded bug is still caught. Exit 0 only when everything passed.

A gate that finds no regression file to replay fails: it is almost always run from the wrong
directory (or with a wrong --regressions-dir), and "passed" would be a lie about what it checked.
`--allow-empty` accepts an empty directory on purpose (a new project's first run).
"""
from __future__ import annotations

import time
from pathlib import Path

from fuzzattn.campaigns.outcome import FAIL, SKIP, Outcome
from fuzzattn.cli import changes, common, mutants, replay, tables

# The gate's budget while Triton runs under its CPU interpreter, per campaign (one implementation
# and one dtype). Measured on the 2-core CI machine, hypothesis seed 0, ci/dev shapes: the
# interpreted triton_fa2 judges 60 cases in 16-20 s per dtype when the machine is otherwise idle,
# torch_tiled and sdpa in under a second; the 9 default campaigns took 55-105 s in all. The 30 s
# cap bounds each campaign when the machine is shared (it then judges fewer cases, and says so),
# so the gate stays under ~2 minutes plus replay time. Compiled on a GPU the profile's count applies.
GATE_INTERPRETED_EXAMPLES = 60
GATE_INTERPRETED_SECONDS = 30.0
GATE_COMPILED_SECONDS = 120.0


def add_parser(commands) -> None:
    p = commands.add_parser("gate", help="replay regression files, fuzz within a budget, optionally self-test on mutants",
                            description="The CI gate: (1) replay regressions/ on every supporting "
                                        "implementation, (2) fuzz every registered implementation, "
                                        "(3) with --mutants, the mutant self-test. Exit 0 only when all pass.")
    common.budget_options(p, f"cases per campaign (default: {GATE_INTERPRETED_EXAMPLES} while Triton is "
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
    p.add_argument("--regressions-dir", type=Path, metavar="DIR",
                   help="regression files to replay and where new ones go (default: "
                        "FUZZATTN_REGRESSIONS_DIR, else ./regressions)")
    p.add_argument("--allow-empty", action="store_true",
                   help="pass even when there is no regression file to replay")
    p.add_argument("--impl", action="append", default=[], metavar="FILE.py:NAME",
                   help="also replay and fuzz an implementation defined outside the repo; repeatable")
    common.isolation_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from fuzzattn.campaigns.regression_file import default_dir, discover, display_path
    started = time.perf_counter()
    profile = common.load_profile(args.profile)
    isolate, timeout = common.isolation(args)
    regressions_dir = args.regressions_dir or default_dir()
    paths = discover(regressions_dir)
    probe_isolated = isolate or replay.any_needs_isolation(paths)
    subjects = common.registered() + [common.resolve(spec, probe_isolated, timeout)
                                      for spec in args.impl]
    to_fuzz, notes = changes.plan(args.changed_since, subjects)   # a bad REV stops here
    interpreted = common.triton_interpreted()
    max_examples = args.max_examples or (GATE_INTERPRETED_EXAMPLES if interpreted else profile.max_examples)
    seconds = args.seconds or (GATE_INTERPRETED_SECONDS if interpreted else GATE_COMPILED_SECONDS)
    progress = tables.Progress()
    header = (f"fuzzattn gate: profile={profile.name} hypothesis_seed={args.hypothesis_seed} "
              f"budget={max_examples} cases / {seconds:g} s per campaign; triton "
              f"{'interpreted' if interpreted else 'compiled'}; regressions {display_path(regressions_dir)}"
              f"{'; isolated' if isolate else ''}{' timeout=%g s' % timeout if timeout else ''}")

    # (1) every known bug stays fixed, on every implementation that can run its case
    outcomes = replay.replay_all(paths, subjects, only_given=False, progress=progress,
                                 isolate=isolate, timeout=timeout)
    if not paths and not args.allow_empty:
        outcomes.append(Outcome("replay", display_path(regressions_dir), FAIL, False,
                                detail="no regression files to replay (wrong directory? "
                                       "--regressions-dir DIR, or --allow-empty)",
                                message=f"{display_path(regressions_dir)} holds no *.json regression "
                                        "file: the gate would replay nothing. Run it from the "
                                        "repository root, pass --regressions-dir, or --allow-empty."))

    # (2) look for new bugs; counterexamples become regression files for step (1) next time
    for impl in subjects:
        if impl.name not in to_fuzz:
            outcomes.append(Outcome("fuzz", impl.name, SKIP, True, skipped=True,
                                    detail=f"unchanged since {args.changed_since}: replayed only"))
            continue
        for dtype in common.dtypes_of(impl, None):
            outcomes.append(common.run_campaign(impl, dtype, profile=profile, max_examples=max_examples,
                                                seconds=seconds, hypothesis_seed=args.hypothesis_seed,
                                                save=True, regressions_dir=regressions_dir,
                                                progress=progress, isolate=isolate, timeout=timeout))

    # (3) the fuzzer still catches every seeded bug
    if args.mutants:
        selected = mutants.select([])
        runs = mutants.run_mutants(selected, profile=profile, max_examples=max_examples,
                                   seconds=seconds, hypothesis_seed=args.hypothesis_seed,
                                   progress=progress, isolate=isolate, timeout=timeout)
        outcomes += runs
        notes.append(mutants.mutation_score(runs) if runs else "no mutants registered")

    wall = time.perf_counter() - started
    notes.append(f"{len(paths)} regression file(s) replayed; wall time {wall:.0f} s")
    print(header)
    for note in notes:
        print(note)
    print(tables.summary_table(outcomes))
    details = tables.failure_details(outcomes)
    if details:
        print("\n" + details)
    passed = all(o.passed for o in outcomes)
    print(f"\ngate {'passed' if passed else 'FAILED'}: {tables.totals(outcomes)} in {wall:.0f} s")
    if args.junit_xml:
        tables.write_text(args.junit_xml, tables.junit_xml(outcomes))
        print(f"JUnit XML: {args.junit_xml}")
    if args.markdown:
        tables.write_text(args.markdown, tables.markdown(outcomes, notes=[header] + notes))
        print(f"markdown summary: {args.markdown}")
    return 0 if passed else 1
