"""A time-boxed fuzzing campaign over every registered implementation and declared dtype (or the
ones named), written as one JSON result per run so that runs add up: parts of one plan run as
concurrent processes, shards of a plan draw other cases, and --report sums any set of results.

    python benchmarks/gpu_campaign.py --seconds 300 --out runs/       # every campaign
    python benchmarks/gpu_campaign.py --seconds 300 --out runs/ --part 0/8 --shard 0 --isolate
    python benchmarks/gpu_campaign.py --report runs/                  # the totals

A run is one *shard*: its Hypothesis seeds are 1000 * shard + 0, 1, 2 ..., so another shard draws
other cases (default: the next unused shard in --out). The budget is split evenly over the
(implementation, dtype) campaigns of the plan (of its part, with --part I/N). Inside its slot a
campaign fuzzes, and after a counterexample (shrunk, written under --regressions-dir) goes on
with the next seed, until the slot is spent or MAX_FAILURES_PER_CAMPAIGN were found.

A failure is "covered" when a file of --known-regressions expects the implementation to fail on
this device type with the same dtype, causal alignment and configuration (what the known
upstream defects depend on): a hint for triage (benchmarks/gpu_triage.py), not a verdict.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import time
from pathlib import Path

MAX_FAILURES_PER_CAMPAIGN = 3
SEEDS_PER_SHARD = 1000
# A sub-run draws the profile's max_examples cases (1000 for gpu), then the next seed starts.
# Not one huge sub-run: once the time cap is hit, campaign.fuzz lets the remaining draws pass
# unjudged, and Hypothesis still draws every one of them up to max_examples.
RESULT_GLOB = "gpu_campaign_*.json"
REPO = Path(__file__).resolve().parent.parent


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, help="wall-clock budget for the whole run")
    p.add_argument("--out", type=Path, help="directory for the JSON result")
    p.add_argument("--report", type=Path, nargs="+", metavar="PATH",
                   help="instead of a run: sum these results (files or directories of them) "
                        "as markdown: cases per implementation and dtype, the distinct findings")
    p.add_argument("--profile", default="gpu", help="size profile (default gpu; ci for a CPU check)")
    p.add_argument("--shard", type=int, default=None,
                   help="shard number (distinct Hypothesis seeds); default: the next unused in --out")
    p.add_argument("--impl", action="append", default=[],
                   help="only these implementations (name or FILE.py:NAME); default: every registered one")
    p.add_argument("--dtype", action="append", default=[],
                   help="only these dtypes (of those each implementation declares); default: all")
    p.add_argument("--regressions-dir", type=Path, default=None,
                   help="where counterexamples are written (default: OUT/regressions, to review "
                        "before copying into regressions/)")
    p.add_argument("--part", default=None, metavar="I/N",
                   help="run only campaigns I, I+N, I+2N ... of the (implementation, dtype) plan "
                        "(the budget split over those): N processes with parts 0/N..N-1/N cover "
                        "the plan between them; with N above the plan's length, part I runs "
                        "campaign I mod length (default: every campaign)")
    p.add_argument("--palette", type=int, default=None, metavar="N",
                   help="compile palette for compiled Triton kernels (strategies/palette.py); default: "
                        "each Hypothesis seed's own. A second run with another --shard and the same "
                        "--palette draws new cases over the variants the first one compiled")
    p.add_argument("--gradient-every", type=int, default=1, metavar="N",
                   help="judge gradients on one drawn case in N (campaign.fuzz); default 1: all")
    p.add_argument("--isolate", action="store_true",
                   help="judge in one supervised worker process per campaign: a hang or a CUDA "
                        "fault is a verdict, and the campaign goes on with a fresh worker")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds per case before an isolated case is a hang (default 120)")
    p.add_argument("--known-regressions", type=Path, default=REPO / "regressions",
                   help="regression files whose expected failures may cover a finding")
    p.add_argument("--warm-up", type=int, default=0, metavar="N",
                   help="judge N cases of each campaign (gradients on every one) before its "
                        "clock starts, unsaved and forgotten: the process's one-off costs (the "
                        "CUDA context, library handles, torch's lazy imports) are start-up, not "
                        "throughput. Not with --isolate (the worker warms itself up)")
    p.add_argument("--stage-times", type=Path, default=None, metavar="FILE",
                   help="time the judge's stages by wall clock (throughput.py's timers), print "
                        "them per judged case and write their totals to FILE as JSON")
    args = p.parse_args(argv)
    if args.report:
        return args
    if args.seconds is None or args.out is None:
        p.error("--seconds and --out are required (or --report PATH ...)")
    if not args.seconds > 0:
        p.error("--seconds must be positive")
    if args.gradient_every < 1:
        p.error(f"--gradient-every {args.gradient_every} must be at least 1")
    if args.part is not None:
        try:
            index, total = (int(x) for x in args.part.split("/"))
            assert 0 <= index < total
        except (ValueError, AssertionError):
            p.error(f"--part {args.part!r} must be I/N with 0 <= I < N")
        args.part = (index, total)
    return args


def next_shard(out: Path) -> int:
    shards = []
    for path in out.glob(RESULT_GLOB):
        try:
            shards.append(int(json.loads(path.read_text())["shard"]))
        except (ValueError, KeyError, TypeError, OSError):
            continue                    # not one of ours: ignore it
    return max(shards, default=-1) + 1


def known_expectations(directory: Path, device_type: str) -> list[tuple[str, object]]:
    """(file name, RegressionFile) of every readable file with an expected failure."""
    from fuzzattn.campaigns.regression_file import RegressionFileError, discover, load
    found = []
    for path in discover(directory):
        try:
            record = load(path)
        except RegressionFileError:
            continue
        if record.expected_failures:
            found.append((path.name, record))
    return found


def covered_by(impl, case, known, device_type: str) -> list[str]:
    """Known files expecting `impl` to fail with this dtype, alignment and configuration. A file
    written without a configuration ran the implementation's default one (each axis's first
    choice), so its configuration is compared with those defaults filled in."""
    def full(config) -> dict:
        return {**{name: choices[0] for name, choices in impl.caps.configs}, **dict(config)}

    return [name for name, record in known
            if record.expected_failure(impl.name, device_type) is not None
            and (record.case.dtype, record.case.causal, full(record.case.config))
            == (case.dtype, case.causal, full(case.config))]


def run_campaign(impl, dtype, *, isolate=False, timeout=120.0, **kw):
    """Fuzz one (implementation, dtype) for `seconds`: a dict for the JSON result. Isolated: one
    worker process for the whole campaign (restarted by IsolatedJudge after a hang or fault)."""
    if not isolate:
        return _run_campaign(impl, dtype, **kw)
    from fuzzattn.isolation.supervisor import IsolatedJudge
    with IsolatedJudge(impl, timeout=timeout) as isolated:
        entry = _run_campaign(impl, dtype, judge_fn=isolated.judge, **kw)
        entry["isolation"] = dict(hangs=isolated.stats.hangs,
                                  device_faults=isolated.stats.device_faults)
        return entry


WARM_UP_SEED = 2 ** 31 - 1      # far above SEEDS_PER_SHARD * any shard used


def _run_campaign(impl, dtype, *, profile, seconds, shard, regressions_dir, known, device_type,
                  gradient_every=1, judge_fn=None, palette=None):
    from fuzzattn.campaigns.campaign import fuzz
    from fuzzattn.strategies.cases import attention_cases
    from fuzzattn.campaigns.compile_palette import campaign_palette
    entry = dict(impl=impl.name, dtype=dtype, cases=0, seconds=0.0, refused={}, failures=[],
                 errors=[], hypothesis_seeds=[], variants={})

    def tally(case):
        """Count the drawn case under each attention variant it uses ("plain" for none)."""
        for variant in case.variants or ("plain",):
            entry["variants"][variant] = entry["variants"].get(variant, 0) + 1
        return case

    start = time.perf_counter()
    for run in range(SEEDS_PER_SHARD):
        left = seconds - (time.perf_counter() - start)
        if left <= 0 or len(entry["failures"]) >= MAX_FAILURES_PER_CAMPAIGN:
            break
        seed = SEEDS_PER_SHARD * shard + run
        entry["hypothesis_seeds"].append(seed)
        # A compiled Triton kernel draws from the seed's compile palette (strategies/palette.py).
        strategy = attention_cases(impl.caps, dtype=dtype, profile=profile,
                                   palette=campaign_palette(impl, seed if palette is None else palette,
                                                           dtype)).map(tally)
        result = fuzz(impl, strategy, max_examples=profile.max_examples, seconds=left,
                      hypothesis_seed_value=seed, save_to_file=True, regressions_dir=regressions_dir,
                      gradient_every=gradient_every, judge_fn=judge_fn)
        entry["cases"] += result.cases
        for summary, n in result.refused.items():
            entry["refused"][summary] = entry["refused"].get(summary, 0) + n
        if result.error is not None:
            entry["errors"].append(result.error)
            break                       # the strategy or harness cannot go on: say so, move on
        found = result.counterexample
        if found is None:
            if result.budget_hit:
                break                   # the slot ran out
            continue                    # max_examples judged: the next seed draws other cases
        failure = found.judged.first_failure
        entry["failures"].append(dict(
            case=found.judged.case.to_dict(), case_text=str(found.judged.case),
            check=failure.check, error=failure.error, allowed=failure.allowed,
            ratio=(failure.error / failure.allowed if failure.error is not None
                   and failure.allowed else None),
            where=failure.where, detail=failure.detail,
            file=str(found.path) if found.path is not None else None,
            covered_by=covered_by(impl, found.judged.case, known, device_type),
            hypothesis_seed=seed, cases_to_first_failure=result.cases_to_first_failure))
    entry["seconds"] = round(time.perf_counter() - start, 3)
    entry["cases_per_s"] = round(entry["cases"] / entry["seconds"], 3) if entry["seconds"] else None
    return entry


def _warm_up(plan, profile, cases: int, palette) -> None:
    """`cases` judged cases of each campaign in `plan`, gradients on every one, before any clock:
    drawn with a seed no campaign uses, saved nowhere, and forgotten after (the verdict memo)."""
    from fuzzattn import settings
    from fuzzattn.campaigns.campaign import forget_verdicts, fuzz
    from fuzzattn.campaigns.compile_palette import campaign_palette
    from fuzzattn.strategies.cases import attention_cases
    with settings.one_cpu_thread():
        for impl, dtype in plan:
            strategy = attention_cases(impl.caps, dtype=dtype, profile=profile,
                                       palette=campaign_palette(impl, palette or 0, dtype))
            fuzz(impl, strategy, max_examples=cases, hypothesis_seed_value=WARM_UP_SEED,
                 save_to_file=False, gradient_every=1)
    forget_verdicts()


def _throughput():
    """benchmarks/throughput.py, whose stage timers --stage-times uses."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import throughput
    return throughput


def _stage_timers(args):
    return contextlib.nullcontext() if args.stage_times is None else _throughput().timing()


def load_results(paths) -> list[dict]:
    """Every gpu_campaign result among `paths` (files, or directories searched for RESULT_GLOB)."""
    files = []
    for path in paths:
        if path.is_dir():
            files += sorted(path.rglob(RESULT_GLOB))
        elif path.is_file():
            files.append(path)
        else:
            raise SystemExit(f"gpu_campaign: {path}: no such file or directory")
    if not files:
        raise SystemExit(f"gpu_campaign: no {RESULT_GLOB} under {', '.join(map(str, paths))}")
    runs = []
    for path in files:
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise SystemExit(f"gpu_campaign: {path}: {exc}") from None
        if not isinstance(data, dict) or "campaigns" not in data:
            raise SystemExit(f"gpu_campaign: {path}: not a gpu_campaign result")
        runs.append(data)
    return runs


def report(runs: list[dict]) -> str:
    """Markdown: the runs, cases per (implementation, dtype), the whole-host rate of runs made
    side by side (all cases over the longest run), and each distinct finding once."""
    totals: dict[tuple[str, str], dict] = {}
    findings: dict[tuple[str, str], dict] = {}
    drawn: dict[tuple[str, str], int] = {}          # (implementation, variant) -> cases drawn
    for run in runs:
        for c in run["campaigns"]:
            t = totals.setdefault((c["impl"], c["dtype"]),
                                  dict(cases=0, seconds=0.0, refused=0, failures=0))
            t["cases"] += c["cases"]
            t["seconds"] += c["seconds"]
            t["refused"] += sum(c.get("refused", {}).values())
            t["failures"] += len(c.get("failures", []))
            for f in c.get("failures", []):
                key = (c["impl"], json.dumps(f["case"], sort_keys=True))
                findings.setdefault(key, dict(f, impl=c["impl"], found=0))["found"] += 1
            for variant, n in c.get("variants", {}).items():
                drawn[c["impl"], variant] = drawn.get((c["impl"], variant), 0) + n
    cases = sum(t["cases"] for t in totals.values())
    longest = max(sum(c["seconds"] for c in run["campaigns"]) for run in runs)
    dates = sorted(run["date"] for run in runs)
    lines = [f"- runs: {len(runs)} (shards {', '.join(str(r['shard']) for r in runs)}), "
             f"{dates[0]} to {dates[-1]}",
             f"- device: {', '.join(sorted({r.get('device', '?') for r in runs}))}; profile "
             f"{', '.join(sorted({r.get('profile', '?') for r in runs}))}"]
    for v in sorted({json.dumps(r.get("versions", {}), sort_keys=True) for r in runs}):
        lines.append("- versions: " + ", ".join(f"{k} {x}" for k, x in json.loads(v).items()))
    lines += ["", "| implementation | dtype | cases judged | seconds | cases/s | refused draws | failures |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for (impl, dtype), t in sorted(totals.items()):
        rate = f"{t['cases'] / t['seconds']:.1f}" if t["seconds"] else ""
        lines.append(f"| {impl} | {dtype} | {t['cases']} | {t['seconds']:.0f} | {rate} | "
                     f"{t['refused']} | {t['failures']} |")
    if drawn:
        lines += ["", "Cases drawn per attention variant (every dtype; a case may use several):",
                  "", "| implementation | variant | cases drawn |", "|---|---|---:|"]
        lines += [f"| {impl} | {variant} | {n} |" for (impl, variant), n in sorted(drawn.items())]
    lines += ["", f"{cases} cases judged in all; side by side, {cases / longest if longest else 0:.1f} "
                  f"cases/s (the longest run {longest:.0f} s)", "", "Findings:", ""]
    if not findings:
        lines.append("none")
    else:
        lines += ["| implementation | check | error / allowed | case | file | covered by | runs |",
                  "|---|---|---|---|---|---|---:|"]
        for f in findings.values():
            numbers = (f"{f['error']:.3g} / {f['allowed']:.3g}"
                       if f.get("error") is not None and f.get("allowed") is not None else "")
            cells = (f["impl"], f["check"], numbers, f["case_text"],
                     Path(f["file"]).name if f.get("file") else "",
                     ", ".join(f.get("covered_by", [])), f["found"])
            lines.append("| " + " | ".join(" ".join(str(x).split()).replace("|", "\\|")
                                             for x in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        print(report(load_results(args.report)), end="")
        return 0
    import torch
    from fuzzattn import settings
    from fuzzattn.cli import common
    from fuzzattn.judgement.judge import default_device
    from fuzzattn.platform.versions import versions
    from fuzzattn.platform import cuda_waits
    profile = settings.load_profile(args.profile)
    settings.choose_backend()             # and the CUDA wait mode, before anything runs there
    waits = cuda_waits.current()
    subjects = [common.resolve(s) for s in args.impl] if args.impl else common.registered()
    plan = [(impl, dtype) for impl in subjects for dtype in common.dtypes_of(impl, None)
            if not args.dtype or dtype in args.dtype]
    if args.part is not None:
        index, total = args.part
        # More parts than campaigns: part I runs campaign I mod len(plan), its own shard giving
        # it other cases than the parts before it on the same campaign.
        plan = plan[index::total] if total <= len(plan) else plan[index % len(plan):][:1]
    args.out.mkdir(parents=True, exist_ok=True)
    shard = args.shard if args.shard is not None else next_shard(args.out)
    regressions_dir = args.regressions_dir or args.out / "regressions"
    device_type = default_device()
    known = known_expectations(args.known_regressions, device_type)
    per_campaign = args.seconds / max(1, len(plan))
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"gpu_campaign: shard {shard}, {len(plan)} campaigns x {per_campaign:.1f} s, profile "
          f"{profile.name}, device {settings.device_description()}, CUDA waits {waits}", flush=True)
    campaigns = []
    if args.warm_up and not args.isolate:
        _warm_up(plan, profile, args.warm_up, args.palette)
    with _stage_timers(args) as stage_totals, settings.one_cpu_thread():
        for impl, dtype in plan:
            entry = run_campaign(impl, dtype, profile=profile, seconds=per_campaign, shard=shard,
                                 regressions_dir=regressions_dir, known=known,
                                 device_type=device_type, gradient_every=args.gradient_every,
                                 isolate=args.isolate, timeout=args.timeout, palette=args.palette)
            campaigns.append(entry)
            note = "; ".join(f"{f['check']} {f['case_text']}" for f in entry["failures"])
            print(f"  {impl.name:16} {dtype:9} {entry['cases']:6} cases {entry['seconds']:7.1f} s"
                  f"  refused {sum(entry['refused'].values()):4}  failures {len(entry['failures'])}"
                  + (f": {note}" if note else ""), flush=True)
    if args.stage_times is not None:
        throughput = _throughput()
        cases = sum(c["cases"] for c in campaigns)
        seconds = sum(c["seconds"] for c in campaigns)
        args.stage_times.write_text(json.dumps(dict(cases=cases, seconds=seconds,
                                                    stages=stage_totals), indent=1) + "\n")
        print(throughput.stage_table({"this run": (stage_totals, cases, seconds)}))
    result = dict(schema=1, date=started.isoformat(timespec="seconds"), shard=shard,
                  profile=profile.name, seconds_budget=args.seconds,
                  gradient_every=args.gradient_every, isolated=args.isolate, palette=args.palette,
                  cuda_waits=cuda_waits.current(),
                  versions=dict(versions(), cuda=torch.version.cuda),
                  device=settings.device_description(), device_type=device_type,
                  backend=settings.backend_description(), campaigns=campaigns)
    # The process id too: concurrent runs started in the same second without --shard pick the
    # same next shard (seen on the H200: 8 of 12 results overwritten), and must not share a file.
    path = args.out / f"gpu_campaign_{started:%Y%m%dT%H%M%S}_shard{shard}_{os.getpid()}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
