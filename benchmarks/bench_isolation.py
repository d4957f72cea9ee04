"""What isolated judging costs: cases judged per second in-process vs in a supervised worker.

Not a test: it prints numbers. Both modes judge cases drawn alike (same profile and strategy,
via `campaign.fuzz`; a fresh seed per campaign, since the verdict memo would answer repeated
cases); isolated adds a pickle round trip per case and one worker start
per campaign, which is timed apart (it precedes a campaign's clock, as in `fuzz(isolate=True)`;
on a CPU-only machine the first start includes the fork server's own import and warm-up, and a
restart after a hang or death is a fork of it: both are printed).
Rows alternate in-process / isolated, repeated, so drift on a noisy machine hits both alike:
compare the ratio column, not absolute rates across runs.

    python benchmarks/bench_isolation.py [--profile ci] [--cases 60] [--repeats 2] [--impl NAME ...]

Measured on the shared 2-core CPU machine (load ~6), 40 ci cases, median of 2: sdpa 81 vs 83
cases/s isolated (ratio 1.02), torch_tiled 76 vs 63 (0.84, +2.6 ms/case); first worker 6.2 s
(the fork server importing torch and judging one case), later ones 0.2 s, a restart 0.2-0.3 s.
"""
from __future__ import annotations

import argparse
import statistics
import time

from fuzzattn import AttentionCase
from fuzzattn.campaigns.campaign import fuzz
from fuzzattn.contract import profiles
from fuzzattn.isolation.supervisor import IsolatedJudge
from fuzzattn.run.registry import implementations
from fuzzattn.settings import one_cpu_thread
from fuzzattn.strategies import attention_cases


_SEED = 0


def _rate(impl, strategy, cases, judge_fn=None) -> float:
    # A fresh seed each call: the per-process verdict memo would otherwise answer repeated cases.
    global _SEED
    _SEED += 1
    result = fuzz(impl, strategy, max_examples=cases, save_to_file=False, judge_fn=judge_fn,
                  hypothesis_seed_value=_SEED)
    if not result.passed:
        raise SystemExit(f"{impl.name} failed during the benchmark: {result.counterexample or result.error}")
    return result.cases / result.seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci", choices=sorted(profiles.PROFILES))
    parser.add_argument("--cases", type=int, default=60, help="cases per campaign")
    parser.add_argument("--repeats", type=int, default=2, help="alternating in-process/isolated pairs")
    parser.add_argument("--impl", action="append", help="implementations (default: sdpa, torch_tiled)")
    args = parser.parse_args(argv)
    profile = profiles.PROFILES[args.profile]
    impls = implementations()
    rows = []
    with one_cpu_thread():               # as the CLI runs; the worker copies the setting
        for name in args.impl or ["sdpa", "torch_tiled"]:
            impl = impls[name]
            strategy = attention_cases(impl.caps, profile=profile)
            fuzz(impl, strategy, max_examples=3, save_to_file=False, hypothesis_seed_value=10**6)
            start = time.perf_counter()
            with IsolatedJudge(impl, timeout=60) as isolated:
                startup = time.perf_counter() - start
                # a restart: what every hang, death or device fault costs before the next case
                isolated._replace()
                start = time.perf_counter()
                isolated.judge(AttentionCase(1, 1, 1, 2, 2, 16))
                restart = time.perf_counter() - start
                inproc, iso = [], []
                for _ in range(args.repeats):
                    inproc.append(_rate(impl, strategy, args.cases))
                    iso.append(_rate(impl, strategy, args.cases, judge_fn=isolated.judge))
            rows.append((name, statistics.median(inproc), statistics.median(iso), startup, restart))
    print(f"profile={profile.name} (seq <= {profile.max_seq}/{profile.max_large_seq}), {args.cases} "
          f"cases per campaign, median of {args.repeats}, a fresh Hypothesis seed per campaign")
    print(f"{'implementation':<14} {'in-process/s':>12} {'isolated/s':>10} {'ratio':>6} "
          f"{'ms/case added':>13} {'worker start s':>14} {'restart s':>9}")
    for name, a, b, startup, restart in rows:
        print(f"{name:<14} {a:>12.1f} {b:>10.1f} {b / a:>6.2f} {1000 * (1 / b - 1 / a):>13.2f} "
              f"{startup:>14.2f} {restart:>9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
