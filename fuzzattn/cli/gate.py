"""`fuzzattn gate`: the pre-merge gate. (1) replay every regression file on every implementation
that supports it, (2) fuzz every implementation within a budget, saving what it finds, (3) with
--mutants, check that every seeded bug is still caught. Exit 0 only when everything passed.

The budget (--budget, the wall time of (1) and (2)) is spent in order: the replay takes what it
needs up to a quarter of it (its files side by side over the --workers processes; files not begun
by then are skip rows), then each fuzzing campaign (one implementation and dtype, over the same
processes) gets an equal share of what is left, so time a quick campaign leaves unused goes to
the later ones; --impl kernels, fuzzed first, share 60% of it when stock ones are fuzzed too.
The gate ends within the budget plus the time to shrink what it found, and the mutant self-test.

A gate that finds no regression file to replay fails: it is almost always run from the wrong
directory (or with a wrong --regressions-dir), and "passed" would be a lie about what it checked.
`--allow-empty` accepts an empty directory on purpose (a new project's first run).
"""
from __future__ import annotations

import time
from pathlib import Path

from fuzzattn.campaigns.outcome import FAIL, SKIP, Outcome
from fuzzattn.cli import changes, common, mutants, replay, tables, workers

# The gate's budget while Triton runs under its CPU interpreter, per campaign (one implementation
# and one dtype). With hypothesis seed 0 and ci/dev shapes on an otherwise idle CI machine, the
# interpreted triton_fa2 judges 60 cases in 16-20 s per dtype, torch_tiled and sdpa in under a
# second; the 9 default campaigns take 55-105 s in all (docs/CALIBRATION.md#gate). The 30 s
# cap bounds each campaign when the machine is shared (it then judges fewer cases, and says so),
# so the gate stays under ~2 minutes plus replay time. Compiled on a GPU the profile's count applies.
GATE_INTERPRETED_EXAMPLES = 60
GATE_INTERPRETED_SECONDS = 30.0      # the mutant self-test's cap per campaign (--mutants)
GATE_COMPILED_SECONDS = 120.0
# The gate's total budget for replay and fuzzing. On a CUDA host, the 5 minutes a pre-merge
# check may take, less one for what the budget does not bound: start-up and loading (before it)
# and the last case of each campaign, which may compile (a cap is checked between cases). On the
# CPU, what the interpreted gate took before it had a budget (55-105 s for the 9 default
# campaigns, plus replay).
GATE_BUDGET_CUDA = 240.0
GATE_BUDGET_CPU = 120.0
MIN_SHARE = 0.5         # seconds: a campaign offered less is not started (reported as not fuzzed)
# The replay may take a quarter of the budget: on a GPU host most of a replay is compiling (one
# kernel per file and shape), and replaying every shipped file once took most of a 240 s budget,
# leaving the campaigns next to nothing. Files not begun by then are skip rows, each named.
REPLAY_SHARE = 0.25
# What the user brings (--impl kernels) gets this share of the fuzzing time when the stock
# references are fuzzed beside it: the change being gated, not the references, is the point.
BROUGHT_SHARE = 0.6
# A campaign not fuzzed says what budget would have given each left this many seconds.
SUGGESTED_SHARE = 10.0
# A registered implementation that compiles per shape is not started on a share shorter than its
# first compiles: a share is checked between cases, so it would end that much past the budget
# (flex's first compiles: benchmarks/REPORT.md, its FlexAttention rows).
FIRST_COMPILES = 40.0


def fuzz_order(plan: list, interpreted: bool, outside: frozenset = frozenset()) -> list:
    """The campaigns in the order they spend the budget. Implementations named with --impl go
    first: they are the change being gated. Under the interpreter, Triton kernels go after the
    others: those judge their cases in a second or two and leave most of their share, which the
    slow interpreted campaigns, going later, then get (each used its whole 5 s share when it went
    first, 11-28 cases, while the gate ended 53 s inside its budget). Implementations that
    compile per shape go last, on what all the others left: their first cases compile for
    longer than an equal share (run(): FIRST_COMPILES)."""
    def key(campaign):
        impl = campaign[0]
        return (impl.name not in outside, _compiles_per_shape(impl),
                interpreted and impl.backend == "triton")
    return sorted(plan, key=key)            # stable: the registry's order otherwise


def _compiles_per_shape(impl) -> bool:
    return bool(getattr(impl.caps, "compiles_per_shape", False))


def add_parser(commands) -> None:
    p = commands.add_parser("gate", help="replay regression files, fuzz within a budget, optionally self-test on mutants",
                            description="The CI gate: (1) replay regressions/ on every supporting "
                                        "implementation, (2) fuzz every registered implementation, "
                                        "(3) with --mutants, the mutant self-test. Exit 0 only when all pass.")
    common.budget_options(p, f"cases per campaign (default: {GATE_INTERPRETED_EXAMPLES} while Triton is "
                             "interpreted, else the profile's max_examples)",
                          "wall-time cap per campaign (default: its share of --budget)")
    p.add_argument("--budget", type=common.seconds, metavar="S",
                   help="wall time of replay and fuzzing together, split over the campaigns "
                        f"(default: {GATE_BUDGET_CUDA:g} on a CUDA host, {GATE_BUDGET_CPU:g} on the CPU)")
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
    p.add_argument("-v", "--verbose", action="store_true",
                   help="list every replayed file's row (default: one line per implementation "
                        "for the files that replayed clean)")
    p.add_argument("--allow-empty", action="store_true",
                   help="pass even when there is no regression file to replay")
    p.add_argument("--impl", action="append", default=[], metavar="FILE.py:NAME",
                   help="also replay and fuzz an implementation defined outside the repo (fuzzed first); "
                        "repeatable")
    workers.add_options(p, default="auto")
    common.stop_option(p)
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
    given = [common.resolve(spec, probe_isolated, timeout) for spec in args.impl]
    subjects = common.registered() + given
    to_fuzz, notes = changes.plan(args.changed_since, subjects)   # a bad REV stops here
    outside = frozenset(impl.name for impl in given)
    interpreted = common.triton_interpreted()
    max_examples = args.max_examples or (GATE_INTERPRETED_EXAMPLES if interpreted else profile.max_examples)
    seconds = args.seconds or (GATE_INTERPRETED_SECONDS if interpreted else GATE_COMPILED_SECONDS)
    budget = args.budget or (GATE_BUDGET_CUDA if workers.visible_gpus() else GATE_BUDGET_CPU)
    deadline = time.perf_counter() + budget     # from here: loading the implementations is not in it
    database = workers.open_database(args.database, regressions_dir)
    n_workers = workers.resolve_count(args.workers)
    progress = tables.Progress()
    header = (f"fuzzattn gate: profile={profile.name} hypothesis_seed={args.hypothesis_seed} "
              f"budget={budget:g} s for replay and fuzzing, up to {max_examples} cases per campaign"
              f"{', at most %g s each' % args.seconds if args.seconds else ''}; "
              f"{n_workers} worker(s); triton {'interpreted' if interpreted else 'compiled'}; "
              f"regressions {display_path(regressions_dir)}"
              f"{'; isolated' if isolate else ''}{' timeout=%g s' % timeout if timeout else ''}")
    print(header, flush=True)

    with workers.Pool(n_workers, progress) as pool:
        # (1) every known bug stays fixed, on every implementation that can run its case; the
        # files side by side over the workers, whose start-up the fuzzing then does not pay
        print(f"gate: replaying {len(paths)} regression file(s)", flush=True)
        replay_ends = time.monotonic() + REPLAY_SHARE * budget     # a clock every worker reads
        outcomes = replay.replay_all(paths, subjects, only_given=False, progress=progress,
                                     isolate=isolate, timeout=timeout, processes=pool,
                                     given=tuple(args.impl), probe_isolated=probe_isolated,
                                     one_file_too=True, deadline=replay_ends)
        cut = len({o.subject.partition(" on ")[0] for o in outcomes
                   if o.detail.startswith("not replayed")})
        if cut:
            notes.append(f"{cut} regression file(s) not replayed in full: the replay's share "
                         f"({REPLAY_SHARE * budget:.0f} s of the {budget:g} s budget) was spent "
                         f"(fuzzattn replay {display_path(regressions_dir)} replays them all)")
        if not paths and not args.allow_empty:
            outcomes.append(Outcome("replay", display_path(regressions_dir), FAIL, False,
                                    detail="no regression files to replay (wrong directory? "
                                           "--regressions-dir DIR, or --allow-empty)",
                                    message=f"{display_path(regressions_dir)} holds no *.json regression "
                                            "file: the gate would replay nothing. Run it from the "
                                            "repository root, pass --regressions-dir, or --allow-empty."))

        # (2) look for new bugs; counterexamples become regression files for step (1) next time
        plan = []
        for impl in subjects:
            if impl.name not in to_fuzz:
                outcomes.append(Outcome("fuzz", impl.name, SKIP, True, skipped=True,
                                        detail=f"unchanged since {args.changed_since}: replayed only"))
                continue
            plan += [(impl, dtype) for dtype in common.dtypes_of(impl, None)]
        plan = fuzz_order(plan, interpreted, outside)
        unfuzzed = 0
        if plan and deadline - time.perf_counter() > MIN_SHARE * len(plan):
            pool.start()        # unless the replay did: start-up is spent before the shares
        print(f"gate: fuzzing {len(plan)} campaign(s) in the {max(0, deadline - time.perf_counter()):.0f} s "
              "left of the budget", flush=True)
        brought = [c for c in plan if c[0].name in outside]
        brought_ends = (time.perf_counter() + BROUGHT_SHARE * (deadline - time.perf_counter())
                        if brought and len(brought) < len(plan) else deadline)
        for i, (impl, dtype) in enumerate(plan):
            # the brought kernels go first (fuzz_order), sharing their part; the rest share
            # what is left, so time one campaign leaves unused passes to the next
            mine = impl.name in outside
            left = sum(1 for c in plan[i:] if (c[0].name in outside) == mine)
            share = ((brought_ends if mine else deadline) - time.perf_counter()) / left
            compiling = _compiles_per_shape(impl) and impl.name not in outside
            if share < (FIRST_COMPILES if compiling else MIN_SHARE):
                unfuzzed += 1
                wanted = budget + SUGGESTED_SHARE * (len(plan) - i)
                why = (f"its {share:.0f} s share is shorter than its first compiles (~{FIRST_COMPILES:g} s)"
                       if compiling and share >= MIN_SHARE else
                       f"the {budget:g} s budget was spent; --budget {wanted:.0f} gives it "
                       f"~{SUGGESTED_SHARE:g} s")
                outcomes.append(Outcome("fuzz", f"{impl.name} {dtype}", SKIP, True, skipped=True,
                                        detail=f"not fuzzed: {why}"))
                continue
            outcomes.append(workers.run_campaign(
                pool, impl, dtype, profile=profile, max_examples=max_examples,
                seconds=min(share, args.seconds) if args.seconds else share,
                hypothesis_seed=args.hypothesis_seed, save=True, regressions_dir=regressions_dir,
                progress=progress, isolate=isolate, timeout=timeout, database=database,
                stop_at_first=args.stop_at_first))
    if unfuzzed:
        notes.append(f"{unfuzzed} campaign(s) not fuzzed: the {budget:g} s budget was spent "
                     "before them, or what was left was shorter than a per-shape compiler's first "
                     "compiles (--budget S)")

    # (3) the fuzzer still catches every seeded bug
    if args.mutants:
        selected = mutants.select([])
        runs = mutants.run_mutants(selected, profile=profile, max_examples=max_examples,
                                   seconds=seconds, hypothesis_seed=args.hypothesis_seed,
                                   progress=progress, isolate=isolate, timeout=timeout)
        outcomes += runs
        notes.append(mutants.mutation_score(runs) if runs else "no mutants registered")

    wall = time.perf_counter() - started
    notes.append(f"{len(paths) - cut} of {len(paths)} regression file(s) replayed in full; "
                 f"wall time {wall:.0f} s")
    for note in notes:
        print(note)
    print(tables.gate_table(outcomes, verbose=args.verbose))
    common.print_after_table(outcomes)
    passed = all(o.passed for o in outcomes)
    print(f"\ngate {'passed' if passed else 'FAILED'}: {tables.totals(outcomes)} in {wall:.0f} s")
    if args.junit_xml:
        tables.write_text(args.junit_xml, tables.junit_xml(outcomes))
        print(f"JUnit XML: {args.junit_xml}")
    if args.markdown:
        tables.write_text(args.markdown, tables.markdown(outcomes, notes=[header] + notes))
        print(f"markdown summary: {args.markdown}")
    return 0 if passed else 1
