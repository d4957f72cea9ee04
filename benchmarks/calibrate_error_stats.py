"""Calibrate the error-statistics check (`out_rms`, fuzzattn/judging/error_statistics.py) on the CPU.

Judges drawn cases (the ci profile's sizes and shape families, every dtype) on the real
implementations with the full engine (`fuzzattn.judgement.judge.judge`), the final rule included,
and reports, per implementation and dtype:

* cases judged and false positives of `out_rms` (a real kernel failing it; must be 0), with the
  first such case printed in full;
* the largest statistic / allowed ratio seen on a real kernel (how much headroom K_RMS leaves);
* any other check a real kernel failed on those cases (must be none: the column stays empty);
* for the precision mutants, the distribution of the same ratio (and of the max rule's
  error / allowed, to show it cannot see them) and the per-case kill rate of `out_rms`, on the
  dtypes where each plants its bug.

    python benchmarks/calibrate_error_stats.py                  # ~10,200 real + 300 triton cases
    python benchmarks/calibrate_error_stats.py --cases 200 --triton-cases 20   # a quick look

Cases are drawn by a `@given` test body run with `settings(max_examples=N)` and a fixed seed,
one run per (implementation, dtype), so the numbers are reproducible.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
from hypothesis import HealthCheck, given, seed as hypothesis_seed, settings

import fuzzattn  # noqa: F401  (selects the Triton backend before kernels import it)
from fuzzattn.contract import profiles
from fuzzattn.judgement.judge import judge
from fuzzattn.run.registry import implementations, mutants
from fuzzattn.strategies.cases import attention_cases

REAL = ("sdpa", "torch_tiled")
# mutant -> the dtypes on which it plants its bug (the accumulator ones only for their dtype)
PRECISION_MUTANTS = {
    "mutant_acc_bf16": ("bfloat16",),
    "mutant_acc_fp16": ("float16",),
    "mutant_pv_low_precision": ("bfloat16", "float16"),
    "mutant_running_max_bf16": ("float32", "bfloat16", "float16"),
}


def campaign(impl, dtype: str, cases: int, seed: int) -> list:
    """Judge `cases` drawn cases; returns (case, out_rms verdict, out verdict, other failures)."""
    results = []

    @hypothesis_seed(seed)
    @settings(max_examples=cases, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(attention_cases(impl.caps, dtype=dtype, profile=profiles.PROFILES["ci"]))
    def body(case):
        report = judge(impl, case, device="cpu", margins=True)   # the whole rule's allowance
        if report.skipped:
            return
        named = {v.check: v for v in report.verdicts}
        others = [v for v in report.failures if v.check not in ("out_rms", "out")]
        results.append((case, named.get("out_rms"), named.get("out"), others))

    body()
    return results


def ratio(verdict) -> float:
    if verdict is None or verdict.error is None:
        return float("nan")
    if verdict.allowed == 0:
        return 0.0 if verdict.error == 0 else math.inf
    return verdict.error / verdict.allowed


def quantiles(values) -> str:
    values = sorted(v for v in values if not math.isnan(v))
    if not values:
        return "-"
    at = lambda q: values[min(len(values) - 1, int(q * len(values)))]
    return (f"p10 {at(0.1):.2f}  p50 {at(0.5):.2f}  p90 {at(0.9):.2f}  max {values[-1]:.2f}  "
            f"caught {sum(v > 1 for v in values) / len(values):.0%}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1700,
                        help="cases per (real implementation, dtype); default 1700 (10,200 in all)")
    parser.add_argument("--triton-cases", type=int, default=100,
                        help="cases per dtype for triton_fa2 under the interpreter (slow)")
    parser.add_argument("--mutant-cases", type=int, default=300, help="cases per (mutant, dtype)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("FUZZATTN_PROFILE", "ci")
    torch.set_num_threads(1)

    real = implementations()
    plan = [(real[name], args.cases) for name in REAL]
    if "triton_fa2" in real and args.triton_cases:
        plan.append((real["triton_fa2"], args.triton_cases))
    total, false_positives, worst = 0, [], (0.0, None)
    print(f"calibrate out_rms: ci profile, seed {args.seed}")
    print(f"{'implementation':28s} {'dtype':9s} {'cases':>6s} {'FP':>3s} {'max ratio':>9s} "
          f"{'p50 ratio':>9s} {'s':>6s}  other failures")
    for impl, cases in plan:
        for dtype in ("float32", "bfloat16", "float16"):
            if dtype not in impl.caps.dtypes:
                continue
            start = time.perf_counter()
            rows = campaign(impl, dtype, cases, args.seed)
            ratios = [ratio(stat) for _, stat, _, _ in rows]
            fps = [(case, stat) for case, stat, _, _ in rows if stat is not None and not stat.passed]
            others = sum(bool(o) for *_, o in rows)
            total += len(rows)
            false_positives += [(impl.name, c, s) for c, s in fps]
            best = max(((r, c) for r, (c, *_) in zip(ratios, rows)), default=(0.0, None),
                       key=lambda rc: rc[0])
            if best[0] > worst[0]:
                worst = (best[0], f"{impl.name} {best[1]}")
            median = sorted(ratios)[len(ratios) // 2] if ratios else float("nan")
            print(f"{impl.name:28s} {dtype:9s} {len(rows):6d} {len(fps):3d} {best[0]:9.3f} "
                  f"{median:9.3f} {time.perf_counter() - start:6.0f}  {others or ''}", flush=True)
    print(f"\nreal-kernel cases judged: {total}; out_rms false positives: {len(false_positives)}")
    print(f"largest out_rms statistic/allowed on a real kernel: {worst[0]:.3f} ({worst[1]})")
    for name, case, stat in false_positives[:5]:
        print(f"  FALSE POSITIVE {name}: {stat.headline()}\n    {case!r}")

    zoo = mutants()
    print("\nprecision mutants: out_rms statistic/allowed (and the max rule's error/allowed)")
    for name, dtypes in PRECISION_MUTANTS.items():
        for dtype in dtypes:
            rows = campaign(zoo[name], dtype, args.mutant_cases, args.seed)
            print(f"  {name:26s} {dtype:9s} n={len(rows):4d}  out_rms: "
                  f"{quantiles(ratio(s) for _, s, _, _ in rows)}")
            print(f"  {'':26s} {'':9s} {'':6s}  out:     "
                  f"{quantiles(ratio(o) for _, _, o, _ in rows)}", flush=True)
            killed = sum((s is not None and not s.passed) or (o is not None and not o.passed)
                         or bool(rest) for _, s, o, rest in rows)
            print(f"  {'':26s} {'':9s} {'':6s}  killed by any check: "
                  f"{killed / max(len(rows), 1):.0%}", flush=True)
    return 1 if false_positives else 0


if __name__ == "__main__":
    sys.exit(main())
