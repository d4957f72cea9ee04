"""What limits judged cases per second on one GPU shared by K processes: the raw cost of a
synchronisation and of a launch under K CUDA contexts, and how fast the device part of judging
(the implementation's two runs with their checks, no oracle) goes on its own.

Not a test: each process prints one JSON line; run K of them at once and sum (benchmarks/
gpu_speed_call.sh contention does, for K = 1, 4, 16, with and without MPS when the host has it).

    python benchmarks/contention_probe.py syncs --seconds 8      # tiny kernel, synchronize, again
    python benchmarks/contention_probe.py launches --seconds 8   # 100 tiny kernels, synchronize
    python benchmarks/contention_probe.py runs --seconds 20 --impl sdpa --dtype float32
        # gpu-profile cases materialised on the host beforehand; timed: inputs to the device, the
        # adversarial run and the plain run with their flags read back (fuzzattn/run/runs.py), per case

`syncs` and `launches` separate the two suspects of the scaling tables in THROUGHPUT.md: if K
contexts time-slice per synchronisation, syncs/s per process falls as 1/K while the GPU idles;
if per launch, launches/s does.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


START_AT = None       # --start-at: the shared start of the measured window


def _loop(seconds: float, body) -> tuple[int, float]:
    """Run body() until `seconds` passed, from START_AT if given; (iterations, seconds taken)."""
    if START_AT is not None:
        time.sleep(max(0.0, START_AT - time.time()))
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        body()
        n += 1
    return n, time.perf_counter() - start


def syncs(seconds: float, device) -> dict:
    import torch
    x = torch.zeros(1, device=device)

    def body():
        x.add_(1)
        torch.cuda.synchronize(device)

    body()
    n, took = _loop(seconds, body)
    return dict(mode="syncs", per_second=n / took, syncs=n, seconds=took)


def launches(seconds: float, device, per_sync: int = 100) -> dict:
    import torch
    x = torch.zeros(1, device=device)

    def body():
        for _ in range(per_sync):
            x.add_(1)
        torch.cuda.synchronize(device)

    body()
    n, took = _loop(seconds, body)
    return dict(mode="launches", per_second=n * per_sync / took, launches=n * per_sync,
                seconds=took)


def runs(seconds: float, device, impl_name: str, dtype: str, cases: int, seed: int) -> dict:
    from hypothesis import given, settings
    from hypothesis import seed as hypothesis_seed

    import fuzzattn  # noqa: F401  (backend selection)
    from fuzzattn.contract.profiles import PROFILES
    from fuzzattn.inputs.materialize import materialize
    from fuzzattn.run.runs import run as _run
    from fuzzattn.judge.placement import check_device
    from fuzzattn.run.registry import get
    from fuzzattn.strategies import attention_cases

    impl = get(impl_name)
    profile = PROFILES["gpu"]         # sizes only: the process's Hypothesis profile stays as it is
    drawn = []

    @hypothesis_seed(seed)
    @settings(max_examples=cases, database=None, deadline=None)
    @given(attention_cases(impl.caps, dtype=dtype, profile=profile))
    def draw(case):
        drawn.append(case)

    draw()
    material = [(case, materialize(case, "cpu")) for case in drawn]

    def one(case, host):
        pristine = host.on(device)
        here = check_device(case, device)      # where the runs deliver their outputs
        first = _run(impl, case, device, adversarial=True, inputs=pristine.copy(),
                     pristine=pristine, here=here)
        if first.failure is None and first.call.answered:
            _run(impl, case, device, adversarial=False, inputs=pristine.copy(), pristine=pristine,
                 here=here)

    for case, host in material[:5]:          # warm-up: first dispatches, allocator
        one(case, host)
    i = {"n": 0}

    def body():
        case, host = material[i["n"] % len(material)]
        one(case, host)
        i["n"] += 1

    n, took = _loop(seconds, body)
    return dict(mode="runs", per_second=n / took, cases=n, seconds=took, impl=impl_name,
                dtype=dtype, distinct_cases=len(material))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("syncs", "launches", "runs"))
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--impl", default="sdpa")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--cases", type=int, default=200, help="distinct cases drawn for `runs`")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-at", type=float, default=None, metavar="EPOCH",
                   help="after set-up, wait until this time.time() so that K processes measure the "
                        "same window (their imports and set-up take different times)")
    args = p.parse_args(argv)
    import torch
    global START_AT
    START_AT = args.start_at
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and args.mode != "runs":
        p.error(f"{args.mode} measures CUDA contexts; no GPU is visible here")
    if args.mode == "syncs":
        result = syncs(args.seconds, device)
    elif args.mode == "launches":
        result = launches(args.seconds, device)
    else:
        result = runs(args.seconds, device, args.impl, args.dtype, args.cases, args.seed)
    result.update(pid=os.getpid(), device=str(device))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
