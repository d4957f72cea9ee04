"""`fuzzattn gate`: the pre-merge gate. (1) replay every regression file on every implementation
that supports it, (2) fuzz every implementation within a budget, saving what it finds, (3) with
--mutants, check that every seeded bug is still caught. Exit 0 only when everything passed.

The budget (--budget, the wall time of (1) and (2)) is spent in order: the replay takes what it
needs up to a quarter of it (its files side by side over the --workers processes, smallest case
first; files not begun by then are skip rows), then each fuzzing campaign (one implementation
and dtype, over the same processes) gets an equal share of what is left, so time a quick campaign leaves unused goes to
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


class _Gate:
    """One gate run, its steps in the order they spend the budget: replay, fuzz, mutants, report."""

    def __init__(self, args):
        from fuzzattn.campaigns.regression_file import default_dir, discover, display_path
        self.args, self.started = args, time.perf_counter()
        self.profile = common.load_profile(args.profile)
        self.isolate, self.timeout = common.isolation(args)
        self.regressions_dir = args.regressions_dir or default_dir()
        self.shown_dir = display_path(self.regressions_dir)
        self.paths = discover(self.regressions_dir)
        self.probe_isolated = self.isolate or replay.any_needs_isolation(self.paths)
        given = [common.resolve(spec, self.probe_isolated, self.timeout) for spec in args.impl]
        self.subjects = common.registered() + given
        self.to_fuzz, self.notes = changes.plan(args.changed_since, self.subjects)  # a bad REV stops here
        self.outside = frozenset(impl.name for impl in given)
        self.interpreted = common.triton_interpreted()
        self.max_examples = args.max_examples or (GATE_INTERPRETED_EXAMPLES if self.interpreted
                                                  else self.profile.max_examples)
        self.seconds = args.seconds or (GATE_INTERPRETED_SECONDS if self.interpreted
                                        else GATE_COMPILED_SECONDS)
        self.budget = args.budget or (GATE_BUDGET_CUDA if workers.visible_gpus() else GATE_BUDGET_CPU)
        self.deadline = time.perf_counter() + self.budget   # loading the implementations is not in it
        self.database = workers.open_database(args.database, self.regressions_dir)
        self.n_workers = workers.resolve_count(args.workers)
        self.progress = tables.Progress()
        self.outcomes: list[Outcome] = []
        self.cut = 0                    # files not replayed in full
        self.header = (
            f"fuzzattn gate: profile={self.profile.name} hypothesis_seed={args.hypothesis_seed} "
            f"budget={self.budget:g} s for replay and fuzzing, up to {self.max_examples} cases per "
            f"campaign{', at most %g s each' % args.seconds if args.seconds else ''}; "
            f"{self.n_workers} worker(s); triton {'interpreted' if self.interpreted else 'compiled'}; "
            f"regressions {self.shown_dir}"
            f"{'; isolated' if self.isolate else ''}"
            f"{' timeout=%g s' % self.timeout if self.timeout else ''}")

    def replay(self, pool) -> None:
        """(1) every known bug stays fixed, on every implementation that can run its case; the
        files side by side over the workers, whose start-up the fuzzing then does not pay."""
        print(f"gate: replaying {len(self.paths)} regression file(s)", flush=True)
        ends = time.monotonic() + REPLAY_SHARE * self.budget     # a clock every worker reads
        self.outcomes = replay.replay_all(
            replay.smallest_first(self.paths), self.subjects, only_given=False, progress=self.progress,
            isolate=self.isolate, timeout=self.timeout, processes=pool,
            given=tuple(self.args.impl), probe_isolated=self.probe_isolated, one_file_too=True,
            deadline=ends)
        self.cut = len({o.subject.partition(" on ")[0] for o in self.outcomes
                        if o.detail.startswith("not replayed")})
        if self.cut:
            self.notes.append(
                f"{self.cut} regression file(s) not replayed in full: the replay's share "
                f"({REPLAY_SHARE * self.budget:.0f} s of the {self.budget:g} s budget) was spent "
                f"(fuzzattn replay {self.shown_dir} replays them all)")
        if not self.paths and not self.args.allow_empty:
            self.outcomes.append(Outcome(
                "replay", self.shown_dir, FAIL, False,
                detail="no regression files to replay (wrong directory? --regressions-dir DIR, "
                       "or --allow-empty)",
                message=f"{self.shown_dir} holds no *.json regression file: the gate would replay "
                        "nothing. Run it from the repository root, pass --regressions-dir, or "
                        "--allow-empty."))

    def plan(self) -> list:
        """The campaigns to fuzz, in the order they spend the budget; the rest are skip rows."""
        plan = []
        for impl in self.subjects:
            if impl.name not in self.to_fuzz:
                self.outcomes.append(Outcome(
                    "fuzz", impl.name, SKIP, True, skipped=True,
                    detail=f"unchanged since {self.args.changed_since}: replayed only"))
                continue
            plan += [(impl, dtype) for dtype in common.dtypes_of(impl, None)]
        return fuzz_order(plan, self.interpreted, self.outside)

    def fuzz(self, pool) -> None:
        """(2) look for new bugs; counterexamples become regression files for (1) next time."""
        plan, unfuzzed = self.plan(), 0
        if plan and self.deadline - time.perf_counter() > MIN_SHARE * len(plan):
            pool.start()        # unless the replay did: start-up is spent before the shares
        print(f"gate: fuzzing {len(plan)} campaign(s) in the "
              f"{max(0, self.deadline - time.perf_counter()):.0f} s left of the budget", flush=True)
        brought = [c for c in plan if c[0].name in self.outside]
        brought_ends = (time.perf_counter() + BROUGHT_SHARE * (self.deadline - time.perf_counter())
                        if brought and len(brought) < len(plan) else self.deadline)
        for i, (impl, dtype) in enumerate(plan):
            # the brought kernels go first (fuzz_order), sharing their part; the rest share
            # what is left, so time one campaign leaves unused passes to the next
            mine = impl.name in self.outside
            left = sum(1 for c in plan[i:] if (c[0].name in self.outside) == mine)
            share = ((brought_ends if mine else self.deadline) - time.perf_counter()) / left
            compiling = _compiles_per_shape(impl) and not mine
            if share < (FIRST_COMPILES if compiling else MIN_SHARE):
                unfuzzed += 1
                self.outcomes.append(Outcome("fuzz", f"{impl.name} {dtype}", SKIP, True,
                                             skipped=True, detail=self._not_fuzzed(
                                                 share, compiling, len(plan) - i)))
                continue
            self.outcomes.append(workers.run_campaign(
                pool, impl, dtype, profile=self.profile, max_examples=self.max_examples,
                seconds=min(share, self.args.seconds) if self.args.seconds else share,
                hypothesis_seed=self.args.hypothesis_seed, save=True,
                regressions_dir=self.regressions_dir, progress=self.progress,
                isolate=self.isolate, timeout=self.timeout, database=self.database,
                stop_at_first=self.args.stop_at_first))
        if unfuzzed:
            self.notes.append(
                f"{unfuzzed} campaign(s) not fuzzed: the {self.budget:g} s budget was spent "
                "before them, or what was left was shorter than a per-shape compiler's first "
                "compiles (--budget S)")

    def _not_fuzzed(self, share: float, compiling: bool, left: int) -> str:
        if compiling and share >= MIN_SHARE:
            return (f"not fuzzed: its {share:.0f} s share is shorter than its first compiles "
                    f"(~{FIRST_COMPILES:g} s)")
        wanted = self.budget + SUGGESTED_SHARE * left
        return (f"not fuzzed: the {self.budget:g} s budget was spent; --budget {wanted:.0f} "
                f"gives it ~{SUGGESTED_SHARE:g} s")

    def mutants(self) -> None:
        """(3) the fuzzer still catches every seeded bug."""
        runs = mutants.run_mutants(mutants.select([]), profile=self.profile,
                                   max_examples=self.max_examples, seconds=self.seconds,
                                   hypothesis_seed=self.args.hypothesis_seed,
                                   progress=self.progress, isolate=self.isolate,
                                   timeout=self.timeout)
        self.outcomes += runs
        self.notes.append(mutants.mutation_score(runs) if runs else "no mutants registered")

    def report(self) -> int:
        wall = time.perf_counter() - self.started
        self.notes.append(f"{len(self.paths) - self.cut} of {len(self.paths)} regression file(s) "
                          f"replayed in full; wall time {wall:.0f} s")
        for note in self.notes:
            print(note)
        print(tables.gate_table(self.outcomes, verbose=self.args.verbose))
        common.print_after_table(self.outcomes)
        passed = all(o.passed for o in self.outcomes)
        print(f"\ngate {'passed' if passed else 'FAILED'}: {tables.totals(self.outcomes)} "
              f"in {wall:.0f} s")
        if self.args.junit_xml:
            tables.write_text(self.args.junit_xml, tables.junit_xml(self.outcomes))
            print(f"JUnit XML: {self.args.junit_xml}")
        if self.args.markdown:
            tables.write_text(self.args.markdown, tables.markdown(
                self.outcomes, notes=[self.header] + self.notes))
            print(f"markdown summary: {self.args.markdown}")
        return 0 if passed else 1


def run(args) -> int:
    gate = _Gate(args)
    print(gate.header, flush=True)
    with workers.Pool(gate.n_workers, gate.progress) as pool:
        gate.replay(pool)
        gate.fuzz(pool)
    if args.mutants:
        gate.mutants()
    return gate.report()
