"""Every verdict of a fixed set of judgements, one line each, for checking that a speed change
changed no verdict: run it on two trees and compare the files (`cmp`).

    python benchmarks/verdict_digest.py OUT [--cases 150]
    PYTHONPATH=/path/to/other/tree python benchmarks/verdict_digest.py OUT2   # from that tree

Judged: sdpa (float32, bfloat16), torch_tiled (float16) and two mutants chosen because they fail
in different checks (phantom keys: values; a detached denominator: gradients), each on the same
`--cases` drawn cases of the ci profile (Hypothesis seed 7), gradients on every case. A line is
the verdict's check, passed, error, allowed, where and detail, by repr: a last-digit change of a
statistic shows.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import fuzzattn  # noqa: F401  (selects the Triton backend first)
import torch
from hypothesis import HealthCheck, given, seed, settings

from fuzzattn import settings as run_settings
from fuzzattn.engine.judge import judge
from fuzzattn.engine.registry import implementations, mutants
from strategies import attention_cases

JUDGED = (("sdpa", "float32"), ("sdpa", "bfloat16"), ("torch_tiled", "float16"),
          ("mutant_phantom_keys", "float32"), ("mutant_tiled_denominator_detached", "float32"))


def digest(impl, dtype: str, cases: int, profile) -> list[str]:
    lines = []

    @seed(7)
    @settings(max_examples=cases, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(attention_cases(impl.caps, dtype=dtype, profile=profile))
    def loop(case):
        judged = judge(impl, case)
        lines.append(f"{impl.name} {dtype} {case!r} skipped={judged.skipped!r} "
                     f"refused={judged.refused!r}")
        lines.extend(f"  {v.check} {v.passed} {v.error!r} {v.allowed!r} {v.where!r} {v.detail!r}"
                     for v in judged.verdicts)

    loop()
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--cases", type=int, default=150)
    parser.add_argument("--also", action="append", default=[], metavar="IMPL:DTYPE",
                        help="judge this implementation and dtype too (after the default ones)")
    args = parser.parse_args(argv)
    profile = run_settings.load_profile("ci")
    if run_settings.wants_one_thread():
        torch.set_num_threads(1)
    impls = {**implementations(), **mutants()}
    lines = []
    for name, dtype in list(JUDGED) + [tuple(a.split(":")) for a in args.also]:
        lines += digest(impls[name], dtype, args.cases, profile)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} lines, {sum(1 for l in lines if l.startswith('  grad_'))} gradient "
          f"verdicts -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
