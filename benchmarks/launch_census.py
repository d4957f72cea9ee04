"""What one judged case asks of the GPU: kernel launches, copies and waits per case, by name.

Several fuzzing processes on one GPU time-slice it between their CUDA contexts, and every launch
and every wait of a case is a point where the GPU may switch to another process's context. This
counts them, so that a change to the judge is measured in what it removes rather than guessed:

    python benchmarks/launch_census.py --impl sdpa_math --dtype float32 --cases 200

Draws the cases first (the `gpu` profile's strategy for the implementation, Hypothesis seed 0),
judges a few to warm up, then judges the rest under torch.profiler, gradients on one case in
`--gradient-every` as in the scaling runs. Prints per case: CUDA kernels, memory copies and
fills by direction, host-side launch and synchronisation calls, the GPU's busy time, and the
kernels and runtime calls that occur most. GPU only (the profiler's CUDA activity).
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fuzzattn  # noqa: E402,F401  (selects the Triton backend first)
import torch  # noqa: E402
from hypothesis import given, seed, settings  # noqa: E402

from fuzzattn.campaigns.campaign import judge_once  # noqa: E402
from fuzzattn.campaigns.compile_palette import campaign_palette  # noqa: E402
from fuzzattn import settings as run_settings  # noqa: E402
from fuzzattn.engine.registry import implementations  # noqa: E402
from strategies.cases import attention_cases  # noqa: E402


def draw(impl, dtype: str, profile, count: int) -> list:
    """`count` cases of the campaign strategy, drawn once (Hypothesis seed 0)."""
    strategy = attention_cases(impl.caps, dtype=dtype, profile=profile,
                               palette=campaign_palette(impl, 0))
    cases = []

    @seed(0)
    @settings(max_examples=count, database=None, deadline=None)
    @given(strategy)
    def collect(case):
        cases.append(case)

    collect()
    return cases


def _gradients(case, every: int) -> bool:
    """campaign.fuzz's choice: by the case's key (a sha256 prefix), one case in `every`."""
    return every == 1 or int(case.key(), 16) % every == 0


def census(impl, cases, device, gradient_every: int):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for case in cases:
            judge_once(impl, case, device, gradients=_gradients(case, gradient_every))
        torch.cuda.synchronize()
    kernels, copies, runtime = collections.Counter(), collections.Counter(), collections.Counter()
    busy_us = 0.0
    for event in prof.events():
        name = event.name
        if event.device_type == torch.autograd.DeviceType.CUDA:
            busy_us += event.time_range.elapsed_us()
            if "Memcpy" in name or "Memset" in name:
                copies[name] += 1
            else:
                kernels[name] += 1
        elif name.startswith(("cuda", "cu")) and not name.startswith("cudnn"):
            runtime[name] += 1
    return kernels, copies, runtime, busy_us


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="sdpa_math")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--gradient-every", type=int, default=4)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("launch_census.py: no CUDA device (it counts CUDA activity)", file=sys.stderr)
        return 2
    impl = implementations()[args.impl]
    profile = run_settings.load_profile("gpu")
    cases = draw(impl, args.dtype, profile, args.warmup + args.cases)
    device = torch.device("cuda")
    for case in cases[:args.warmup]:
        judge_once(impl, case, device, gradients=_gradients(case, args.gradient_every))
    measured = cases[args.warmup:]
    kernels, copies, runtime, busy_us = census(impl, measured, device, args.gradient_every)
    n = len(measured)
    print(f"{impl.name} {args.dtype}: {n} cases, gradients on 1 in {args.gradient_every}")
    print(f"  per case: {sum(kernels.values()) / n:.1f} kernels, {sum(copies.values()) / n:.1f} "
          f"copies/fills, GPU busy {busy_us / n:.0f} us")
    launches = sum(c for name, c in runtime.items() if "Launch" in name)
    syncs = sum(c for name, c in runtime.items() if "Synchronize" in name)
    print(f"  host calls per case: {launches / n:.1f} launches, {syncs / n:.1f} synchronisations, "
          f"{sum(runtime.values()) / n:.1f} runtime calls in all")
    for title, counter in (("kernels", kernels), ("copies", copies), ("runtime", runtime)):
        print(f"  {title}, per case:")
        for name, count in counter.most_common(args.top):
            print(f"    {count / n:6.2f}  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
