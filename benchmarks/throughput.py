"""Judged cases per second, per implementation and dtype, with where the time of a case goes.

Not a test: it prints numbers, measured in one run (compare the ratios on a noisy CPU; absolute
rates only on the GPU). Three figures per row:

    pipeline   `fuzz()`: everything the gate does per drawn case — materialise once, run the
               implementation twice (adversarial NaN-poisoned memory, then plain), the float64
               oracle and the same-precision reference, every check, Hypothesis's drawing
    bare       the same Hypothesis loop over the same strategy with the least a differential
               test can do: materialise, run once, the float64 oracle, one max-error compare
               (the oracle as the judge's is, with the score and output magnitudes its noise
               terms read; `--lean-bare`: without them, a plain float64 attention)
    ratio      pipeline cost per case / bare cost per case (the issue's target: <= 1.5 on CPU)

With `--repeats N` the pipeline and the bare loop run N times each, alternating, on the same
cases (the verdict memo emptied before each pipeline run): the rates are the medians, the ratio
is the median of the N pairs' own ratios (each pair measured within a second or two), and its
range is printed beside it. The 2-core machines drift by 20% within minutes and a single pair
has measured anywhere from 1.26 to 1.87 on the same tree, which one pair cannot tell from a change.

and a per-case breakdown of the pipeline (milliseconds per judged case: drawing, materialising,
implementation runs, references, the rest), from a second, profiled run (cProfile slows
Python-heavy stages; the rate is measured without it).

    python benchmarks/throughput.py [--profile ci] [--cases 200] [--impl sdpa --impl torch_tiled]

Scaling over processes is measured with pytest-xdist, as users run it:
`pytest tests/test_differential.py -k sdpa-float32 -n N --fuzzattn-shards N` prints
"fuzzattn: K cases judged in S s". benchmarks/gpu_call.sh measures campaigns of concurrent parts.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import fuzzattn  # noqa: F401  (selects the Triton backend first)
import torch
from hypothesis import given, seed, settings

from fuzzattn import settings as run_settings
from fuzzattn.campaigns.campaign import forget_verdicts, fuzz
from fuzzattn.contract.dtypes import DTYPES
from fuzzattn.run import execute
from fuzzattn.inputs.materialize import materialize
from fuzzattn.judge.judge import default_device
from fuzzattn.judge.oracle import _attend, oracle
from fuzzattn.run.registry import implementations
from fuzzattn.strategies import attention_cases

from host_profile import stage_ms    # benchmarks/, this script's own folder

# Functions whose cumulative time makes up each stage of the breakdown (file, function).
STAGES = {
    "draw (hypothesis)": ("cases.py", "_cases"),
    "materialise": ("inputs.py", "materialize"),
    "implementation runs": ("execute.py", "call"),
    "oracle + reference": ("oracle.py", "_attend"),
    "gradients": ("gradients.py", "judge_gradients"),
}


def lean_oracle(q, k, v, case):
    """The float64 oracle without the score and output magnitudes (the noise terms' inputs):
    what a differential test that only compares values would compute."""
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


def breakdown(profile: cProfile.Profile, cases: int) -> dict[str, float]:
    return stage_ms(pstats.Stats(profile).stats, cases, STAGES)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--cases", type=int, default=200, help="cases per implementation and dtype")
    parser.add_argument("--impl", action="append", help="only these implementations")
    parser.add_argument("--dtype", action="append", choices=DTYPES)
    parser.add_argument("--gradient-every", type=int, default=1, metavar="N",
                        help="judge gradients on one case in N (campaign.fuzz; default 1: all)")
    parser.add_argument("--lean-bare", action="store_true",
                        help="the bare loop's oracle without the magnitudes (lean_oracle)")
    parser.add_argument("--repeats", type=int, default=1, metavar="N",
                        help="pipeline and bare loop N times each, alternating; medians reported")
    args = parser.parse_args(argv)
    profile = run_settings.load_profile(args.profile)
    if run_settings.wants_one_thread():
        torch.set_num_threads(1)       # as CPU xdist workers run
    device = default_device()
    impls = implementations()
    rows = []
    for name in args.impl or sorted(impls):
        impl = impls[name]
        for dtype in (d for d in DTYPES if d in impl.caps.dtypes and d in (args.dtype or DTYPES)):
            if run_settings.bf16_unavailable(impl) and dtype == "bfloat16":
                continue
            strategy = attention_cases(impl.caps, dtype=dtype, profile=profile)
            fuzz(impl, strategy, max_examples=5, save_to_file=False, hypothesis_seed_value=99)  # warm-up
            # The bare loop's own first cases of a dtype are slow too (measured: bf16's first
            # pair's ratio 0.78-0.90 where the others were 1.4-1.9), which flattered the median.
            reference = lean_oracle if args.lean_bare else oracle
            bare_loop(impl, strategy, 5, device, reference)
            # The rate unprofiled. A fixed seed: two trees (or two runs) compared judge the same
            # cases, as the bare loop does; random draws made one tree's rate vary by 1.5x.
            rates, bare_rates = [], []
            for _ in range(args.repeats):
                forget_verdicts()
                start = time.perf_counter()
                result = fuzz(impl, strategy, max_examples=args.cases, save_to_file=False,
                              hypothesis_seed_value=0, gradient_every=args.gradient_every)
                rates.append(result.cases / (time.perf_counter() - start))
                bare_cases, bare_seconds = bare_loop(impl, strategy, args.cases, device,
                                                     reference)
                bare_rates.append(bare_cases / bare_seconds)
            # The breakdown from a second, profiled run of other cases (cProfile slows
            # Python-heavy stages, so its total is not the rate).
            profiler = cProfile.Profile()
            profiler.enable()
            profiled = fuzz(impl, strategy, max_examples=args.cases, save_to_file=False,
                            hypothesis_seed_value=1, gradient_every=args.gradient_every)
            profiler.disable()
            ratios = [b / p for p, b in zip(rates, bare_rates)]
            rows.append((name, dtype, result.cases, statistics.median(rates),
                         statistics.median(bare_rates), statistics.median(ratios),
                         (min(ratios), max(ratios)), breakdown(profiler, profiled.cases),
                         result.passed))
    print(f"profile={profile.name} device={run_settings.device_description()} "
          f"threads={torch.get_num_threads()} gradient_every={args.gradient_every} "
          f"repeats={args.repeats} bare_oracle={'lean' if args.lean_bare else 'judge'} "
          f"{run_settings.backend_description()}")
    print(f"{'implementation':<16}{'dtype':<10}{'cases':>6}{'cases/s':>9}{'bare/s':>9}{'ratio':>7}"
          f"{'range':>12}  "
          + "  ".join(f"{s} ms" for s in STAGES) + "  verdict")
    for name, dtype, cases, rate, bare_rate, ratio, (low, high), stages, passed in rows:
        print(f"{name:<16}{dtype:<10}{cases:>6}{rate:>9.1f}{bare_rate:>9.1f}{ratio:>7.2f}"
              f"{f'{low:.2f}-{high:.2f}':>12}  "
              + "  ".join(f"{stages[s]:>{len(s) + 3}.2f}" for s in STAGES)
              + f"  {'pass' if passed else 'FOUND A FAILURE'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
