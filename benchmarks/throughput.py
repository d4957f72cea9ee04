"""Judged cases per second of the full pipeline against a bare differential loop, per
implementation and dtype, and where a judged case's time goes, stage by stage.

    pipeline   `campaign.fuzz`: what the gate does per drawn case (two runs of the implementation,
               one in NaN-poisoned memory; the float64 oracle and the same-precision reference;
               every check; gradients on one case in --gradient-every)
    bare       the same Hypothesis loop over the same strategy doing the least a differential test
               does: materialise, one run, the float64 oracle, one max-error compare
               (`--lean-bare`: an oracle without the magnitudes the noise terms read)
    ratio      bare rate / pipeline rate; with --repeats N the two loops alternate N times on the
               same cases (a fixed seed) and the ratio is the median of the N pairs' ratios, since
               a small machine's speed drifts within minutes

The stage table (milliseconds per judged case) comes from a separate run of other cases with
wall-clock timers around the judge's stages (about a microsecond a call, so the rates above are
measured without them); "outside the judge" is Hypothesis's drawing and the campaign's own work.
`gpu_campaign.py --stage-times` uses the same timers on a GPU.

    python benchmarks/throughput.py [--profile ci] [--cases 200] [--impl sdpa ...] [--dtype float32 ...]
                                    [--gradient-every 1] [--repeats 1] [--lean-bare] [--no-stages]

`--cli` measures instead what a user's command gets: `fuzzattn fuzz --impl NAME --dtype D
--max-examples N --no-save` as typed (watched, the default) against the same command with
FUZZATTN_SUPERVISE=off (in-process), alternating --repeats times; each rate is the campaign's own
cases / seconds from the command's table (start-up excluded), the ratio watched / in-process.

`--cli-workers 1,2,4` measures how the command scales over worker processes: `fuzzattn fuzz
--impl NAME --dtype D --workers N --seconds S --max-examples 1000000 --no-save --database off`
for each N in turn (auto allowed), --repeats rounds; each rate is the campaign's cases / seconds
from its table (the workers' start-up excluded), the ratio against 1 worker of the same run.

    python benchmarks/throughput.py --cli-workers 1,2,4,8 --seconds 30 --impl sdpa --dtype float32
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import statistics
import time

import fuzzattn  # noqa: F401  (selects the Triton backend before anything imports triton)
import torch
from hypothesis import given, seed, settings

from fuzzattn import settings as run_settings
from fuzzattn.campaigns.campaign import forget_verdicts, fuzz
from fuzzattn.contract.dtypes import DTYPES
from fuzzattn.inputs.materialize import materialize
from fuzzattn.judgement.judge import default_device
from fuzzattn.judging.oracle import _attend, oracle
from fuzzattn.run import execute
from fuzzattn.run.registry import implementations
from fuzzattn.strategies import attention_cases

# (module, attribute, stage): each attribute is wrapped where its callers look it up. Nested
# stages count in their parents too (`judge` holds everything below it).
STAGES = (
    ("fuzzattn.campaigns.verdicts", "judge", "judge"),
    ("fuzzattn.judgement.judge", "materialize", "materialise"),
    ("fuzzattn.run.runs", "launch", "runs: launch"),
    ("fuzzattn.run.runs", "deliver", "runs: read-back"),
    ("fuzzattn.judgement.judge", "oracle", "oracle"),
    ("fuzzattn.judgement.judge", "same_precision_reference", "same-precision reference"),
    ("fuzzattn.judgement.judge", "moved_together", "references moved"),
    ("fuzzattn.judgement.judge", "value_verdicts", "value checks"),
    ("fuzzattn.judgement.judge", "same_bits", "determinism compare"),
    ("fuzzattn.judgement.judge", "judge_gradients", "gradients"),
    ("fuzzattn.gradients.gradient_verdicts", "run_backward", "gradients: runs"),
    ("fuzzattn.gradients.gradient_verdicts", "oracle_gradients", "gradients: oracle"),
    ("fuzzattn.gradients.gradient_verdicts", "same_precision_gradients", "gradients: reference"),
    ("fuzzattn.gradients.gradient_verdicts", "_values", "gradients: value checks"),
)
OUTSIDE = "outside the judge"


def unresolved() -> list[str]:
    """STAGES entries this tree does not have (a renamed function): its stage would read 0."""
    return [f"{module}.{attribute}" for module, attribute, _ in STAGES
            if not hasattr(importlib.import_module(module), attribute)]


@contextlib.contextmanager
def timing():
    """Every stage of STAGES timed while inside; yields {stage: seconds}, filled as cases are
    judged, and puts the original functions back after. A missing attribute is skipped."""
    totals = {stage: 0.0 for _, _, stage in STAGES}

    def timed(fn, stage):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[stage] += time.perf_counter() - start
        return wrapper

    originals = []
    try:
        for module, attribute, stage in STAGES:
            owner = importlib.import_module(module)
            if hasattr(owner, attribute):
                originals.append((owner, attribute, getattr(owner, attribute)))
                setattr(owner, attribute, timed(getattr(owner, attribute), stage))
        yield totals
    finally:
        for owner, attribute, original in reversed(originals):
            setattr(owner, attribute, original)


def stage_table(columns: dict[str, tuple[dict, int, float]]) -> str:
    """{label: (stage seconds, judged cases, wall seconds)} as ms per judged case, one column
    per label."""
    width = max([10] + [len(label) + 2 for label in columns])
    lines = [f"{'ms per judged case':<28}" + "".join(f"{label:>{width}}" for label in columns)]
    for stage in [stage for _, _, stage in STAGES] + [OUTSIDE, "all"]:
        cells = []
        for totals, cases, seconds in columns.values():
            value = {OUTSIDE: seconds - totals["judge"], "all": seconds}.get(stage, totals.get(stage))
            cells.append(f"{1000.0 * value / max(cases, 1):{width}.2f}")
        lines.append(f"{stage:<28}" + "".join(cells))
    lines.append(f"{'judged cases':<28}" + "".join(f"{cases:>{width}}" for _, cases, _ in columns.values()))
    return "\n".join(lines)


def lean_oracle(q, k, v, case):
    """The float64 oracle without the score and output magnitudes (the noise terms' inputs):
    what a differential test that only compares values computes."""
    return _attend(q, k, v, case, torch.float64, None, magnitudes=False)


def bare_loop(impl, strategy, cases: int, device, reference=oracle) -> tuple[int, float]:
    count = {"n": 0, "worst": 0.0}

    @seed(0)
    @settings(max_examples=cases, database=None, deadline=None, derandomize=False)
    @given(strategy)
    def loop(case):
        inputs = materialize(case, device)
        call = execute.call(impl, *inputs.tensors(), case)
        truth = reference(*inputs.tensors(), case)
        if call.answered and call.out.numel():      # the compare a bare differential test makes
            count["worst"] = max(count["worst"], float((call.out.double() - truth.out).abs().max()))
        count["n"] += 1

    start = time.perf_counter()
    loop()
    return count["n"], time.perf_counter() - start


def measure(impl, strategy, args, device, reference) -> dict:
    """One row: the rates (medians over --repeats) and, unless --no-stages, the stage totals."""
    fuzz(impl, strategy, max_examples=5, save_to_file=False, hypothesis_seed_value=99)  # warm-up
    bare_loop(impl, strategy, 5, device, reference)    # the bare loop's first cases are slow too
    rates, bare_rates, passed = [], [], True
    for _ in range(args.repeats):
        forget_verdicts()
        start = time.perf_counter()
        result = fuzz(impl, strategy, max_examples=args.cases, save_to_file=False,
                      hypothesis_seed_value=0, gradient_every=args.gradient_every)
        rates.append(result.cases / (time.perf_counter() - start))
        passed = passed and result.passed
        bare_cases, bare_seconds = bare_loop(impl, strategy, args.cases, device, reference)
        bare_rates.append(bare_cases / bare_seconds)
    ratios = [b / p for p, b in zip(rates, bare_rates)]
    row = dict(cases=result.cases, rate=statistics.median(rates),
               bare=statistics.median(bare_rates), ratio=statistics.median(ratios),
               low=min(ratios), high=max(ratios), passed=passed, stages=None)
    if not args.no_stages:
        with timing() as totals:
            start = time.perf_counter()
            timed = fuzz(impl, strategy, max_examples=args.cases, save_to_file=False,
                         hypothesis_seed_value=1, gradient_every=args.gradient_every)
            row["stages"] = (dict(totals), timed.cases, time.perf_counter() - start)
    return row


def cli_rate(impl: str, dtype: str, cases: int, profile: str, watched: bool) -> float:
    """Judged cases per second of one `fuzzattn fuzz` command, read from its table."""
    import os
    import re
    import subprocess
    import sys
    env = dict(os.environ)
    env.pop("FUZZATTN_SUPERVISE", None)
    if not watched:
        env["FUZZATTN_SUPERVISE"] = "off"
    done = subprocess.run([sys.executable, "-m", "fuzzattn.cli", "fuzz", "--impl", impl, "--dtype",
                           dtype, "--max-examples", str(cases), "--profile", profile, "--no-save"],
                          capture_output=True, text=True, env=env)
    row = re.search(rf"^{re.escape(impl)}\s+{dtype}\s+\S+\s+(\d+)\s+([\d.]+)", done.stdout, re.M)
    if row is None:
        raise SystemExit(f"throughput.py: no table row for {impl} {dtype}:\n{done.stdout}{done.stderr}")
    return int(row.group(1)) / max(float(row.group(2)), 0.05)     # the table rounds to 0.1 s


def cli_table(impls, dtypes, cases: int, profile: str, repeats: int) -> str:
    lines = [f"{'implementation':<16}{'dtype':<10}{'cases':>6}{'watched/s':>11}{'in-process/s':>14}"
             f"{'ratio':>7}{'range':>12}"]
    for name in impls:
        for dtype in dtypes:
            pairs = []
            for _ in range(repeats):
                pairs.append((cli_rate(name, dtype, cases, profile, True),
                              cli_rate(name, dtype, cases, profile, False)))
            ratios = [w / p for w, p in pairs]
            watched = statistics.median(w for w, _ in pairs)
            plain = statistics.median(p for _, p in pairs)
            lines.append(f"{name:<16}{dtype:<10}{cases:>6}{watched:>11.1f}{plain:>14.1f}"
                         f"{statistics.median(ratios):>7.3f}{min(ratios):>6.2f}-{max(ratios):.2f}")
    return "\n".join(lines)


def workers_rate(impl: str, dtype: str, workers: str, seconds: float, profile: str) -> tuple[float, int]:
    """(judged cases per second, cases) of `fuzzattn fuzz --workers N --seconds S`, from its table."""
    import os
    import re
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "fuzzattn.cli", "fuzz", "--impl", impl, "--dtype",
                           dtype, "--workers", workers, "--seconds", f"{seconds:g}", "--max-examples",
                           "1000000", "--profile", profile, "--no-save", "--database", "off"],
                          capture_output=True, text=True, env=dict(os.environ))
    row = re.search(rf"^{re.escape(impl)}\s+{dtype}\s+\S+\s+(\d+)\s+([\d.]+)", done.stdout, re.M)
    if row is None:
        raise SystemExit(f"throughput.py: no table row for {impl} {dtype}:\n{done.stdout}{done.stderr}")
    return int(row.group(1)) / max(float(row.group(2)), 0.05), int(row.group(1))


def workers_table(impls, dtypes, counts: list[str], seconds: float, profile: str, repeats: int) -> str:
    lines = [f"{'implementation':<16}{'dtype':<10}{'workers':>8}{'cases':>8}{'cases/s':>10}"
             f"{'vs 1':>7}{'range':>12}"]
    for name in impls:
        for dtype in dtypes:
            rates: dict[str, list[tuple[float, int]]] = {n: [] for n in ["1"] + counts}
            for _ in range(repeats):
                for n in rates:
                    rates[n].append(workers_rate(name, dtype, n, seconds, profile))
            one = [r for r, _ in rates["1"]]
            for n in ["1"] + counts:
                ratios = [r / max(o, 1e-9) for (r, _), o in zip(rates[n], one)]
                lines.append(f"{name:<16}{dtype:<10}{n:>8}{statistics.median(c for _, c in rates[n]):>8.0f}"
                             f"{statistics.median(r for r, _ in rates[n]):>10.1f}"
                             f"{statistics.median(ratios):>7.2f}{min(ratios):>6.2f}-{max(ratios):.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci", help="size profile (default ci)")
    parser.add_argument("--cases", type=int, default=200, help="cases per implementation and dtype")
    parser.add_argument("--impl", action="append", help="only these implementations")
    parser.add_argument("--dtype", action="append", choices=DTYPES, help="only these dtypes")
    parser.add_argument("--gradient-every", type=int, default=1, metavar="N",
                        help="judge gradients on one case in N (default 1: every case; a large N "
                             "measures the forward only)")
    parser.add_argument("--repeats", type=int, default=1, metavar="N",
                        help="pipeline and bare loop N times each, alternating; medians reported")
    parser.add_argument("--lean-bare", action="store_true",
                        help="the bare loop's oracle without the noise terms' magnitudes")
    parser.add_argument("--no-stages", action="store_true", help="skip the stage table's run")
    parser.add_argument("--cli", action="store_true",
                        help="rates of the `fuzzattn fuzz` command itself, watched against in-process")
    parser.add_argument("--cli-workers", metavar="N,N,...",
                        help="rates of `fuzzattn fuzz --workers N` for each N (and 1), as typed")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="--cli-workers: each command's --seconds (default 20)")
    args = parser.parse_args(argv)
    if args.cli_workers:
        import os
        counts = [n.strip() for n in args.cli_workers.split(",") if n.strip() and n.strip() != "1"]
        bad = [n for n in counts if n != "auto" and not (n.isdigit() and int(n) > 1)]
        if bad or not counts:
            parser.error(f"--cli-workers {args.cli_workers!r}: whole numbers above 1 or auto, comma-separated")
        print(f"fuzzattn fuzz --workers N --seconds {args.seconds:g}, profile={args.profile}, "
              f"{run_settings.device_description()}, {os.cpu_count()} cores, median of "
              f"{args.repeats} round(s); vs 1: rate / the 1-worker rate of the same round")
        print(workers_table(args.impl or ["sdpa"], args.dtype or ["float32"], counts, args.seconds,
                            args.profile, args.repeats))
        return 0
    if args.cli:
        print(f"fuzzattn fuzz, profile={args.profile}, {run_settings.device_description()}, "
              f"median of {args.repeats} alternating pair(s)")
        print(cli_table(args.impl or ["sdpa"], args.dtype or ["float32"], args.cases, args.profile,
                        args.repeats))
        return 0
    profile = run_settings.load_profile(args.profile)
    device = default_device()
    impls = implementations()
    unknown = sorted(set(args.impl or ()) - set(impls))
    if unknown:
        parser.error(f"not registered: {', '.join(unknown)}")
    reference = lean_oracle if args.lean_bare else oracle
    rows = {}
    with run_settings.one_cpu_thread():          # as CPU xdist workers run
        for name in args.impl or sorted(impls):
            impl = impls[name]
            for dtype in (d for d in DTYPES if d in impl.caps.dtypes and d in (args.dtype or DTYPES)):
                if dtype == "bfloat16" and run_settings.bf16_unavailable(impl):
                    continue
                strategy = attention_cases(impl.caps, dtype=dtype, profile=profile)
                rows[(name, dtype)] = measure(impl, strategy, args, device, reference)
        threads = torch.get_num_threads()
    print(f"profile={profile.name} device={run_settings.device_description()} threads={threads} "
          f"gradient_every={args.gradient_every} repeats={args.repeats} "
          f"bare_oracle={'lean' if args.lean_bare else 'judge'} {run_settings.backend_description()}")
    print(f"{'implementation':<16}{'dtype':<10}{'cases':>6}{'cases/s':>9}{'bare/s':>9}{'ratio':>7}"
          f"{'range':>12}  verdict")
    for (name, dtype), r in rows.items():
        spread = f"{r['low']:.2f}-{r['high']:.2f}"
        print(f"{name:<16}{dtype:<10}{r['cases']:>6}{r['rate']:>9.1f}{r['bare']:>9.1f}"
              f"{r['ratio']:>7.2f}{spread:>12}  {'pass' if r['passed'] else 'FOUND A FAILURE'}")
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    staged = {f"{name} {short[dtype]}": r["stages"] for (name, dtype), r in rows.items() if r["stages"]}
    if staged:
        print()
        print(stage_table(staged))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
