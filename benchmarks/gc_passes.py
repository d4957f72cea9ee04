"""What the garbage collector costs a campaign: passes by generation and their time, per case.

Not a test: it prints numbers measured in one run. One process, one torch thread (as CPU xdist
workers run), a warm-up campaign first (which freezes the long-lived heap: fuzzattn/platform/gc_tuning.py), then
one campaign of --cases cases with a gc callback timing every pass. `--python-default` puts back
Python's thresholds (700, 10, 10) after the warm-up, for the comparison fuzzattn/platform/gc_tuning.py quotes.

    python benchmarks/gc_passes.py [--cases 2000] [--impl sdpa] [--dtype float32] [--python-default]
"""
from __future__ import annotations

import argparse
import collections
import gc
import time

import fuzzattn  # noqa: F401  (selects the Triton backend first)
import torch

from fuzzattn import settings as run_settings
from fuzzattn.campaigns.campaign import fuzz
from fuzzattn.run.registry import implementations
from fuzzattn.strategies import attention_cases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--impl", default="sdpa")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--python-default", action="store_true",
                        help="Python's own thresholds (700, 10, 10) after the warm-up")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    impl = implementations()[args.impl]
    strategy = attention_cases(impl.caps, dtype=args.dtype,
                               profile=run_settings.load_profile(args.profile))
    fuzz(impl, strategy, max_examples=5, save_to_file=False, hypothesis_seed_value=99)
    if args.python_default:
        gc.set_threshold(700, 10, 10)
    passes, seconds, started = collections.Counter(), collections.Counter(), [0.0]

    def timed(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            passes[info["generation"]] += 1
            seconds[info["generation"]] += time.perf_counter() - started[0]

    gc.callbacks.append(timed)
    start = time.perf_counter()
    result = fuzz(impl, strategy, max_examples=args.cases, save_to_file=False,
                  hypothesis_seed_value=0, gradient_every=10 ** 6)
    elapsed = time.perf_counter() - start
    gc.callbacks.remove(timed)
    per_case = 1000.0 / result.cases
    print(f"{args.impl} {args.dtype} profile={args.profile} thresholds={gc.get_threshold()} "
          f"cases={result.cases} ms/case={elapsed * per_case:.3f} "
          f"gc ms/case={sum(seconds.values()) * per_case:.4f} "
          f"objects tracked after={len(gc.get_objects())}")
    for generation in (0, 1, 2):
        print(f"  generation {generation}: {passes[generation]:5d} passes, "
              f"{seconds[generation] * 1000:8.1f} ms in all, "
              f"{seconds[generation] * per_case:.4f} ms a case")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
