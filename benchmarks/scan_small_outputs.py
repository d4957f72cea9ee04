"""Calibration scan of the judge on outputs of very few elements, where the rms rule (out_rms)
meets the max rule: every SDPA backend of this machine on cases of one or two query rows and head
dims 1-4, in bf16 and fp16, mostly with near-constant keys (uniform softmax rows over values that
cancel: |out| far below the size of its terms).

Judged with the full engine (`judge`, forward checks, every tier decided on the whole rule), so
each case reports its out_rms ratio (statistic / allowed). A stock backend failing any check is a
false positive of the judge, or an upstream defect to be recorded; the script exits 1 on either
and prints the first failures as replayable cases.

    python benchmarks/scan_small_outputs.py                     # 50,400 cases, 2 processes
    python benchmarks/scan_small_outputs.py --cases 2000        # a quick look

Cases come from a seeded generator, not Hypothesis: a scan, the same cases every run.
"""
from __future__ import annotations

import argparse
import collections
import math
import multiprocessing
import os
import random
import sys
import time

DTYPES = ("float16", "bfloat16")
# Mostly the profile that found the one-element false positive; the others for contrast.
VALUES = ("near_constant",) * 6 + ("normal", "dominant_key", "zero_query_rows")
SCALES = (None, 0.3, 0.125, 1.0, 2.0)
CAUSAL = ("none", "none", "top_left", "bottom_right")


def draw(rng: random.Random, impl: str):
    from fuzzattn import AttentionCase
    heads = rng.choice((1, 1, 2))
    return AttentionCase(
        batch=1, heads=heads, kv_heads=heads, seq_q=rng.choice((1, 1, 1, 2)),
        seq_k=rng.choice((1, 2, 3, rng.randint(4, 40), rng.randint(4, 160))),
        head_dim=rng.randint(1, 4), dtype=rng.choice(DTYPES), causal=rng.choice(CAUSAL),
        scale=rng.choice(SCALES), values=rng.choice(VALUES), data_seed=rng.randrange(2 ** 31))


def scan(job):
    """Judge `count` cases of `impl` drawn from `seed`: (impl, dtype) -> tallies, failures."""
    impl_name, seed, count = job
    import torch
    import fuzzattn  # noqa: F401  (selects the Triton backend before kernels import it)
    from fuzzattn.judgement.judge import judge
    from fuzzattn.run.registry import implementations
    torch.set_num_threads(1)
    impl = implementations()[impl_name]
    rng = random.Random(seed)
    tallies = collections.defaultdict(lambda: [0, 0, 0.0, 0.0])  # judged, refused, worst ratio, floor share
    failures = []
    for _ in range(count):
        case = draw(rng, impl_name)
        report = judge(impl, case, device="cpu", gradients=False, margins=True)
        row = tallies[case.dtype]
        if report.skipped:
            row[1] += 1
            continue
        row[0] += 1
        stat = next((v for v in report.verdicts if v.check == "out_rms"), None)
        if stat is not None and stat.allowed:
            row[2] = max(row[2], stat.error / stat.allowed)
        if report.failures:
            failures.append((case, [v.headline() for v in report.failures]))
    return impl_name, dict(tallies), failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=50_400, help="cases in all (default 50,400)")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    import fuzzattn  # noqa: F401
    from fuzzattn.run.registry import implementations
    backends = sorted(name for name in implementations() if name.startswith("sdpa"))
    chunks = 24 * len(backends)
    per = max(1, args.cases // chunks)
    jobs = [(name, args.seed * 1_000_003 + i, per) for i in range(24) for name in backends]
    start = time.perf_counter()
    totals = collections.defaultdict(lambda: [0, 0, 0.0])
    failures = []
    with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
        for name, tallies, failed in pool.imap_unordered(scan, jobs):
            for dtype, (judged, refused, worst, _) in tallies.items():
                t = totals[name, dtype]
                t[0] += judged
                t[1] += refused
                t[2] = max(t[2], worst)
            failures += [(name, case, lines) for case, lines in failed]
    seconds = time.perf_counter() - start
    print(f"scan of small outputs: seed {args.seed}, {len(jobs) * per} cases, "
          f"{args.processes} processes, {seconds:.0f} s")
    print(f"{'backend':16s} {'dtype':9s} {'judged':>7s} {'refused':>7s} {'failed':>6s} "
          f"{'worst out_rms ratio':>19s}")
    for (name, dtype), (judged, refused, worst) in sorted(totals.items()):
        failed = sum(1 for n, c, _ in failures if n == name and c.dtype == dtype)
        print(f"{name:16s} {dtype:9s} {judged:7d} {refused:7d} {failed:6d} {worst:19.3f}")
    judged = sum(t[0] for t in totals.values())
    print(f"\njudged {judged}; failures on stock backends: {len(failures)}")
    for name, case, lines in failures[:5]:
        print(f"  {name}: {'; '.join(lines)}\n    {case!r}")
    return 1 if failures or not judged else 0


if __name__ == "__main__":
    sys.exit(main())
