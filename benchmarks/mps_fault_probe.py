"""One process of the MPS fault probe (benchmarks/gpu_speed_call.sh, mode `mpsfault`).

    python benchmarks/mps_fault_probe.py fault     # judges TRITON_OOB at seq_q 4, waits, then 5
    python benchmarks/mps_fault_probe.py innocent  # judges sdpa fp32 cases until told otherwise

Prints one line per judgement ("passed", "verdict CHECK: DETAIL" or "SharedDeviceFault: ...")
and exits 0 after a verdict-only run, 3 after SharedDeviceFault, 4 after any other error. The
innocent process runs for --seconds, judging a fixed, passing sdpa case over and over: under
MPS it must end with SharedDeviceFault (or pass, if the server kept the fault from it), never
with a verdict against sdpa; without MPS it must pass throughout.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import fuzzattn  # noqa: F401  (selects the Triton backend first)
from fuzzattn import AttentionCase
from fuzzattn.platform import mps as shared_gpu
from fuzzattn.judge.judge import judge
from fuzzattn.run.loader import load_implementation
from fuzzattn.run.registry import implementations

KERNELS = Path(__file__).resolve().parent.parent / "tests" / "isolation_kernels.py"


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("fault", "innocent"))
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--fault-after", type=float, default=8.0)
    args = parser.parse_args()
    say(f"{args.role}: mps_active={shared_gpu.mps_active()}")
    if args.role == "fault":
        impl = load_implementation(f"{KERNELS}:TRITON_OOB", probe=False)
        plan = [(4, 0.0), (5, args.fault_after)]
    else:
        impl = implementations()["sdpa"]
        plan = None
    start, judged = time.perf_counter(), 0
    try:
        while True:
            if plan is not None:
                if not plan:
                    break
                seq_q, at = plan.pop(0)
                time.sleep(max(0.0, at - (time.perf_counter() - start)))
            else:
                if time.perf_counter() - start > args.seconds:
                    break
                seq_q = 64
            case = AttentionCase(batch=2, heads=4, kv_heads=4, seq_q=seq_q, seq_k=48,
                                 head_dim=16 if args.role == "fault" else 64)
            result = judge(impl, case, device="cuda", gradients=False)
            judged += 1
            if not result.passed:
                v = result.first_failure
                say(f"verdict {v.check}: {v.detail[:160]}")
            elif args.role == "fault" or judged % 500 == 1:
                say(f"passed ({judged} judged)")
    except shared_gpu.SharedDeviceFault as exc:
        say(f"SharedDeviceFault after {judged} judged: {str(exc)[:300]}")
        return 3
    except Exception as exc:
        say(f"error after {judged} judged: {type(exc).__name__}: {str(exc)[:300]}")
        return 4
    # No synchronisation here: after a fault judged as a verdict (no MPS) the context is dead,
    # and that is the verdict's business, not this probe's (call 48 exited 1 on it).
    say(f"done: {judged} judged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
