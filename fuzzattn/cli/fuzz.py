"""`fuzzattn fuzz`: one campaign per implementation and declared dtype; exit 1 on a counterexample."""
from __future__ import annotations

import time
from pathlib import Path

from fuzzattn.cli import common, tables, workers
from fuzzattn.contract.dtypes import DTYPES


def add_parser(commands) -> None:
    p = commands.add_parser("fuzz", help="fuzz implementations against the float64 oracle",
                            description="Fuzz each implementation, one campaign per declared dtype. "
                                        "Exit 1 when a counterexample is found.")
    p.add_argument("--impl", action="append", required=True, metavar=common.IMPL_METAVAR,
                   help="a registered implementation or mutant, or one defined outside the repo; repeatable")
    common.budget_options(p, "cases per campaign (default: the profile's max_examples, or no "
                             "limit with --seconds alone)",
                          "wall time of the whole command (default: none), shared by its "
                          "campaigns (one per implementation and dtype); alone, the command runs "
                          "this long; with --max-examples, whichever is reached first ends each")
    p.add_argument("--dtype", choices=DTYPES, metavar="D",
                   help=f"fuzz only this dtype ({', '.join(DTYPES)}); default: every declared one")
    p.add_argument("--regressions-dir", type=Path, metavar="DIR",
                   help="where counterexamples are saved (default: FUZZATTN_REGRESSIONS_DIR, else ./regressions)")
    p.add_argument("--no-save", action="store_true", help="do not write counterexamples as regression files")
    workers.add_options(p, default=workers.AUTO_ON_GPU)
    common.stop_option(p)
    common.isolation_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from fuzzattn.campaigns.regression_file import default_dir
    profile = common.load_profile(args.profile)
    isolate, timeout = common.isolation(args)
    subjects = [common.resolve(spec, isolate, timeout) for spec in args.impl]
    plan = [(impl, dtype) for impl in subjects for dtype in common.dtypes_of(impl, args.dtype)]
    # --seconds alone means run that long; --max-examples alone, that many; both: the first reached
    max_examples = args.max_examples or (None if args.seconds else profile.max_examples)
    regressions_dir = args.regressions_dir or default_dir()
    database = workers.open_database(args.database, regressions_dir)
    n_workers = workers.resolve_count(args.workers)
    progress = tables.Progress()
    outcomes, stopped = [], None
    # Stopped from outside (^C, a CI step's timeout), the campaigns done so far are still
    # reported (their files are already saved), then the exit status says how it stopped.
    with common.stop_on_sigterm(), workers.Pool(n_workers, progress) as pool:
        try:
            started = time.perf_counter()
            for done, (impl, dtype) in enumerate(plan):
                outcomes.append(workers.run_campaign(
                    pool, impl, dtype, profile=profile, max_examples=max_examples,
                    seconds=share(args.seconds, started, done, len(plan)), hypothesis_seed=args.hypothesis_seed,
                    save=not args.no_save, regressions_dir=regressions_dir, progress=progress,
                    isolate=isolate, timeout=timeout, database=database,
                    stop_at_first=args.stop_at_first))
        except (KeyboardInterrupt, common.Terminated) as exc:
            pool.close(now=True)
            progress.clear()
            stopped = common.stopped_status(exc)
    plan = plan[:len(outcomes)]

    print(f"fuzzattn fuzz: profile={profile.name} hypothesis_seed={args.hypothesis_seed} "
          f"max_examples={max_examples or 'unbounded'}"
          f"{' seconds=%g' % args.seconds if args.seconds else ''}"
          f"{' isolated' if isolate else ''}{' timeout=%g' % timeout if timeout else ''}"
          f"{' workers=%d' % n_workers if n_workers > 1 else ''}")
    rows = []
    for (impl, dtype), o in zip(plan, outcomes):
        campaign = o.campaign
        found = campaign.counterexample if campaign is not None else None
        rows.append([impl.name, dtype, o.verdict, o.cases, tables.seconds(o.seconds), o.ended,
                     "" if campaign is None or campaign.cases_to_first_failure is None
                     else campaign.cases_to_first_failure,
                     found.judged.first_failure.check if found else "",
                     str(found.judged.case) if found else _detail(o)])
    print(tables.table(("impl", "dtype", "verdict", "cases", "seconds", "ended by",
                        "first failure at", "check", "shrunk case / detail"), rows, max_width=90))
    if stopped is not None:
        signal_name, status = stopped
        common.finish(outcomes, f"stopped by {signal_name} after {len(outcomes)} campaign(s): "
                                f"{tables.totals(outcomes)}")
        return status
    return common.finish(outcomes, tables.totals(outcomes))


# A campaign whose share is spent (the ones before it overran theirs) still gets a cap, this
# small: it then judges nothing and its row says "not fuzzed: the time cap ... ended", a skip,
# never a pass (a cap of 0 would mean no cap at all).
MIN_SHARE = 1e-3


def share(seconds: float | None, started: float, done: int, planned: int) -> float | None:
    """The time cap of the next campaign of `planned`, `done` of them ended, the command's
    `seconds` counted from `started`: an equal part of what is left, so time a quick campaign
    leaves unused goes to the later ones and the command ends near its --seconds. None: no
    --seconds, no cap."""
    if seconds is None:
        return None
    left = seconds - (time.perf_counter() - started) if done else seconds
    return max(left / (planned - done), min(MIN_SHARE, seconds / planned))


def _detail(outcome) -> str:
    """A passing row's detail, less the time cap note that its "ended by" cell says already."""
    return "; ".join(part for part in outcome.detail.split("; ") if not part.startswith("time cap"))
