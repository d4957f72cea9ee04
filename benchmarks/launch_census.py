"""What one judged case asks of the GPU: kernel launches, copies and waits per case, by name.

Several fuzzing processes on one GPU time-slice it between their CUDA contexts, and every launch
and every wait of a case is a point where the GPU may switch to another process's context. This
counts them, so that a change to the judge is measured in what it removes rather than guessed:

    python benchmarks/launch_census.py --impl sdpa_math --dtype float32 --cases 200

    CENSUS_TREE=/tmp/before python benchmarks/launch_census.py ...    (another checkout's judge)

Draws the cases first (the `gpu` profile's strategy for the implementation, Hypothesis seed 0),
judges a few to warm up, then judges the rest under torch.profiler, gradients on one case in
`--gradient-every` as in the scaling runs. Prints per case: CUDA kernels, memory copies and
fills by direction, host-side launch and synchronisation calls, the GPU's busy time, the
kernels and runtime calls that occur most, and the kernels that take the most GPU time. GPU only
(the profiler's CUDA activity).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

# CENSUS_TREE: another checkout's judge counted with this script (a before/after in one call).
sys.path.insert(0, os.environ.get("CENSUS_TREE") or str(Path(__file__).resolve().parent.parent))

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


# The judge's stages, each timed as a profiler range so that the runtime calls inside it (kernel
# launches, copies, synchronisations) are attributed to the innermost stage that made them.
PHASES = (
    ("fuzzattn.engine.judge", "materialize", "materialise inputs"),
    ("fuzzattn.engine.judge", "_run", "forward run: set-up and checks"),     # trees before runs.py
    ("fuzzattn.engine.runs", "launch", "forward run: set-up and checks"),
    ("fuzzattn.engine.runs", "deliver", "forward runs: read-back and checks"),
    ("fuzzattn.engine.judge", "same_bits", "forward: value checks"),
    ("fuzzattn.engine.execute", "call", "forward: the implementation"),
    ("fuzzattn.engine.judge", "oracle", "forward: float64 oracle"),
    ("fuzzattn.engine.judge", "same_precision_reference", "forward: same-precision reference"),
    ("fuzzattn.engine.judge", "_nonfinite_rows", "forward: value checks"),   # trees before
    ("fuzzattn.engine.judge", "_value_verdicts", "forward: value checks"),   # value_checks.py
    ("fuzzattn.engine.value_checks", "nonfinite_rows", "forward: value checks"),
    ("fuzzattn.engine.judge", "value_verdicts", "forward: value checks"),
    ("fuzzattn.engine.judge", "judge_gradients", "gradients: judging"),
    ("fuzzattn.engine.gradients", "_run", "gradients: run set-up and checks"),
    ("fuzzattn.engine.execute", "call_gradients", "gradients: the implementation"),
    ("fuzzattn.engine.gradients", "oracle_gradients", "gradients: float64 oracle"),
    ("fuzzattn.engine.gradients", "same_precision_gradients", "gradients: same-precision reference"),
)
PREFIX = "census: "


def _timed_phases():
    """Wrap each PHASES function in a profiler range named after its stage; returns the undo.
    A stage the judge counted does not have (another tree's, CENSUS_TREE) is left out."""
    import importlib
    undo = []
    for module_name, attribute, label in PHASES:
        try:
            module = importlib.import_module(module_name)
            original = getattr(module, attribute)
        except (ImportError, AttributeError):
            continue

        def timed(*args, __original=original, __label=label, **kwargs):
            with torch.profiler.record_function(PREFIX + __label):
                return __original(*args, **kwargs)

        setattr(module, attribute, timed)
        undo.append((module, attribute, original))
    return lambda: [setattr(m, a, o) for m, a, o in undo]


def census(impl, cases, device, gradient_every: int):
    from torch.profiler import ProfilerActivity, profile
    restore = _timed_phases()
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for case in cases:
                judge_once(impl, case, device, gradients=_gradients(case, gradient_every))
            torch.cuda.synchronize()
    finally:
        restore()
    kernels, copies, runtime = collections.Counter(), collections.Counter(), collections.Counter()
    gpu_us = collections.Counter()      # GPU time by kernel (or copy) name
    by_phase: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    busy_us = 0.0
    events = list(prof.events())
    ranges = sorted(((e.time_range.start, e.time_range.end, e.name[len(PREFIX):])
                     for e in events if e.name.startswith(PREFIX)), key=lambda r: r[0])
    for event in events:
        name = event.name
        if name.startswith(PREFIX):
            continue        # a stage range (the profiler mirrors it on the GPU's timeline too)
        if event.device_type == torch.autograd.DeviceType.CUDA:
            busy_us += event.time_range.elapsed_us()
            gpu_us[name] += event.time_range.elapsed_us()
            if "Memcpy" in name or "Memset" in name:
                copies[name] += 1
            else:
                kernels[name] += 1
        elif name.startswith(("cuda", "cu")) and not name.startswith("cudnn"):
            runtime[name] += 1
            kind = "launches" if "Launch" in name else "syncs" if "Synchronize" in name else \
                "copies" if "Memcpy" in name or "Memset" in name else None
            if kind:
                by_phase[_innermost(ranges, event.time_range.start)][kind] += 1
    return kernels, copies, runtime, busy_us, by_phase, gpu_us


def _innermost(ranges, t) -> str:
    """The label of the latest-starting range containing time t (ranges nest), or 'other'."""
    label = "other (Hypothesis, bookkeeping, between stages)"
    for start, end, name in ranges:
        if start > t:
            break
        if end >= t:
            label = name
    return label


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
    kernels, copies, runtime, busy_us, by_phase, gpu_us = census(impl, measured, device,
                                                                 args.gradient_every)
    n = len(measured)
    print(f"{impl.name} {args.dtype}: {n} cases, gradients on 1 in {args.gradient_every}")
    print(f"  per case: {sum(kernels.values()) / n:.1f} kernels, {sum(copies.values()) / n:.1f} "
          f"copies/fills, GPU busy {busy_us / n:.0f} us")
    launches = sum(c for name, c in runtime.items() if "Launch" in name)
    syncs = sum(c for name, c in runtime.items() if "Synchronize" in name)
    print(f"  host calls per case: {launches / n:.1f} launches, {syncs / n:.1f} synchronisations, "
          f"{sum(runtime.values()) / n:.1f} runtime calls in all")
    print("  by stage, per case: launches / copies / synchronisations")
    for label, counts in sorted(by_phase.items(), key=lambda item: -item[1]["launches"]):
        print(f"    {counts['launches'] / n:6.1f} {counts['copies'] / n:6.1f} {counts['syncs'] / n:6.1f}"
              f"  {label}")
    for title, counter in (("kernels", kernels), ("copies", copies), ("runtime", runtime)):
        print(f"  {title}, per case:")
        for name, count in counter.most_common(args.top):
            print(f"    {count / n:6.2f}  {name[:110]}")
    # At 16 processes the GPU, time-sliced between them, is busy throughout (call 42): its time
    # per case bounds the rate, so this says which kernels to make cheaper or fewer.
    print("  GPU time per case, us, by kernel or copy:")
    for name, us in gpu_us.most_common(args.top):
        print(f"    {us / n:8.1f}  {kernels[name] / n if name in kernels else copies[name] / n:6.2f}x"
              f"  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
