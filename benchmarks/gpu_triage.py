"""Triage of campaign findings: each regression file judged on several implementations, forward
only and then with gradients, each implementation in its own supervised worker process, so a CUDA
fault is a `device_fault` verdict for that (file, implementation, phase) and the rest goes on.

    python benchmarks/gpu_triage.py runs/regressions/*.json --impl sdpa --impl sdpa_math --impl sdpa_cudnn

One line per (file, implementation): the forward's verdict, then the verdict with gradients
(`ok`, `skip: ...`, or the first failing check with error/allowed). A configuration in the file
that an implementation does not accept is dropped (it belongs to the implementation that found
the case). Which backends fail the same case tells an upstream defect (only the fused backends
fail) from a judge error (every backend fails alike); `fuzzattn explain FILE --impl NAME` then
varies one factor of the case at a time.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def verdict(judged) -> str:
    if judged.skipped:
        return "skip: " + judged.skipped[:60]
    if judged.refused:
        return "refused: " + judged.refused[:60]
    first = judged.first_failure
    if first is None:
        return "ok"
    ratio = (f" {first.error:.3g}/{first.allowed:.3g}"
             if first.error is not None and first.allowed else "")
    return f"{first.check}{ratio} {first.where[:40]}".strip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="regression files (JSON)")
    parser.add_argument("--impl", action="append", required=True,
                        help="a registered implementation to judge each file on (repeatable)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds per judgement before it is a hang (default 60)")
    args = parser.parse_args(argv)
    from fuzzattn import settings
    from fuzzattn.campaigns.regression_file import RegressionFileError, load
    from fuzzattn.isolation.supervisor import IsolatedJudge
    from fuzzattn.run.registry import implementations
    settings.load_profile("gpu")
    records = []
    for path in args.files:
        try:
            records.append((path.name, load(path)))
        except RegressionFileError as exc:
            print(f"{path.name}: unreadable: {exc}")
    known = implementations()
    for name in args.impl:
        if name not in known:
            print(f"{name}: not a registered implementation")
            continue
        impl = known[name]
        with IsolatedJudge(impl, timeout=args.timeout) as isolated:
            for file_name, record in records:
                case = record.case
                if impl.caps.why_not(case) is not None:
                    # A file's configuration belongs to the implementation that found it.
                    case = case.replace(config=())
                why = impl.caps.why_not(case)
                if why is not None:
                    print(f"{file_name} {name:15} not declared: {why[:60]}")
                    continue
                forward = verdict(isolated.judge(case, gradients=False))
                both = verdict(isolated.judge(case, gradients=True)) if impl.caps.backward else "-"
                print(f"{file_name} {name:15} forward: {forward:45} with gradients: {both}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
