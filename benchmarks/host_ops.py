"""Torch operations per judged case, by the line of fuzzattn (or kernels/) that asked for them.

Not a test: it prints counts. On the noisy 2-core machines a change of 1-2% in a judged case's time
cannot be told from drift (THROUGHPUT.md: single pipeline/bare pairs range over 1.2-2.3), but
the number of torch operations a case makes is exact and repeats to the digit: it says whether a
change to the judge did what it meant to, and where the rest of the operations come from. The
count is taken with a dispatch mode (every aten operation, views included) over one campaign
(`fuzz`, gradients off unless `--gradient-every`), then over the bare loop of throughput.py on
the same cases. (The mode's own overhead makes its times meaningless: counts only.)

    python benchmarks/host_ops.py [--cases 100] [--impl sdpa] [--dtype float32] [--top 25]
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import fuzzattn  # noqa: F401  (selects the Triton backend first)
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fuzzattn import settings as run_settings
from fuzzattn.campaigns.campaign import forget_verdicts, fuzz
from fuzzattn.run.registry import implementations
from fuzzattn.strategies import attention_cases

from throughput import bare_loop     # benchmarks/, this script's own folder

ROOT = Path(__file__).resolve().parents[1]
OURS = tuple(str(ROOT / d) for d in ("fuzzattn", "kernels", "strategies"))


class OperationCount(TorchDispatchMode):
    """Counts every aten operation by the innermost frame of this repository that led to it."""

    def __init__(self):
        super().__init__()
        self.by_line: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        frame = sys._getframe(1)
        while frame is not None and not frame.f_code.co_filename.startswith(OURS):
            frame = frame.f_back
        where = "(outside)" if frame is None else (
            f"{Path(frame.f_code.co_filename).relative_to(ROOT)}:{frame.f_lineno} "
            f"{frame.f_code.co_name}")
        self.by_line[where] += 1
        return func(*args, **(kwargs or {}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--impl", default="sdpa")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--gradient-every", type=int, default=1_000_000)
    parser.add_argument("--top", type=int, default=25, help="lines listed")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    impl = implementations()[args.impl]
    strategy = attention_cases(impl.caps, dtype=args.dtype,
                               profile=run_settings.load_profile(args.profile))
    fuzz(impl, strategy, max_examples=5, save_to_file=False, hypothesis_seed_value=99)  # warm-up
    forget_verdicts()
    with OperationCount() as pipeline:
        result = fuzz(impl, strategy, max_examples=args.cases, save_to_file=False,
                      hypothesis_seed_value=0, gradient_every=args.gradient_every)
    with OperationCount() as bare:
        bare_cases, _ = bare_loop(impl, strategy, args.cases, "cpu")
    per_case = sum(pipeline.by_line.values()) / result.cases
    bare_per_case = sum(bare.by_line.values()) / bare_cases
    print(f"{args.impl} {args.dtype} profile={args.profile}: {result.cases} cases; torch operations "
          f"a case: pipeline {per_case:.1f}, bare loop {bare_per_case:.1f}")
    by_function: collections.Counter[str] = collections.Counter()
    for where, n in pipeline.by_line.items():
        by_function[where.split(":")[0] + " " + where.split(" ", 1)[-1]] += n
    print(f"\npipeline, by function (operations a case):")
    for where, n in by_function.most_common(args.top):
        print(f"{n / result.cases:8.2f}  {where}")
    print(f"\npipeline, by line (operations a case):")
    for where, n in pipeline.by_line.most_common(args.top):
        print(f"{n / result.cases:8.2f}  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
