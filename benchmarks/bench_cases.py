"""Cases judged per second for each registered implementation, on a profile's case distribution.

Not a test: it prints numbers. A "case" is everything the gate does per drawn case: materialise,
run the implementation twice, the float64 oracle and the same-precision reference, every check.
On a noisy CPU compare the ratios printed in one run, not absolute rates across runs.

    python benchmarks/bench_cases.py [--profile ci] [--cases 60] [--impl NAME ...]
"""
from __future__ import annotations

import argparse
import time

from fuzzattn import profiles
from fuzzattn.campaigns.campaign import fuzz
from fuzzattn.contract.case import DTYPES
from fuzzattn.engine.registry import implementations
from strategies import attention_cases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci", choices=sorted(profiles.PROFILES))
    parser.add_argument("--cases", type=int, default=60, help="cases per implementation and dtype")
    parser.add_argument("--impl", action="append", help="only these implementations")
    args = parser.parse_args(argv)
    profile = profiles.load(args.profile)
    impls = implementations()
    names = args.impl or sorted(impls)
    rows = []
    for name in names:
        impl = impls[name]
        # warm-up, untimed: first calls pay for imports, kernel decoration and allocator growth
        fuzz(impl, attention_cases(impl.caps, profile=profile), max_examples=3, save=False)
        for dtype in (d for d in DTYPES if d in impl.caps.dtypes):
            start = time.perf_counter()
            result = fuzz(impl, attention_cases(impl.caps, dtype=dtype, profile=profile),
                          max_examples=args.cases, save=False)
            seconds = time.perf_counter() - start
            rows.append((name, dtype, result.cases, seconds, result.passed))
    fastest = max(r[2] / r[3] for r in rows)
    print(f"profile={profile.name} (seq <= {profile.max_seq}/{profile.max_large_seq}), "
          f"{args.cases} cases per row, same seed for every row")
    print(f"{'implementation':<14} {'dtype':<9} {'cases':>6} {'seconds':>8} {'cases/s':>8} "
          f"{'vs fastest':>10}  verdict")
    for name, dtype, cases, seconds, passed in rows:
        rate = cases / seconds
        print(f"{name:<14} {dtype:<9} {cases:>6} {seconds:>8.2f} {rate:>8.1f} "
              f"{rate / fastest:>10.3f}  {'pass' if passed else 'FOUND A FAILURE'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
