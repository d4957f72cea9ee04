"""Every verdict of a fixed set of judgements, one line each, for checking that a speed change
changed no verdict: run it on two trees and compare the files (`cmp`).

    python benchmarks/verdict_digest.py OUT [--cases 150]
    PYTHONPATH=/path/to/other/tree python benchmarks/verdict_digest.py OUT2   # from that tree
    python benchmarks/verdict_digest.py --compare OUT OUT2

Judged: sdpa (float32, bfloat16), torch_tiled (float16) and two mutants chosen because they fail
in different checks (phantom keys: values; a detached denominator: gradients), each on the same
`--cases` drawn cases of the ci profile (Hypothesis seed 7), gradients on every case; `--also
IMPL:DTYPE` adds more (a mutant's name, say). `--margins` judges with `margins=True` (every
allowance the whole rule's, the same-precision references always computed): a tree deciding the
rule tier by tier then compares line for line with one from before that. A line is the verdict's
check, passed, error, allowed, where and detail, by repr: a last-digit change of a statistic
shows.

`--compare` is for a change that moves float64 arithmetic (the oracle computed another way):
lines that differ only in their numbers pass, and the largest relative differences among them
are printed for a look (an error is a difference of nearly equal numbers, so its own relative
change can be ~1e-6 when the oracle moved by 1e-15); every line that differs in anything else (a
check, a verdict, a place, a case) is printed, and makes the exit status 1.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import fuzzattn  # noqa: F401  (selects the Triton backend first)
import torch
from hypothesis import HealthCheck, given, seed, settings

from fuzzattn import settings as run_settings
from fuzzattn.judge.judge import judge
from fuzzattn.run.registry import implementations, mutants
from fuzzattn.strategies import attention_cases

JUDGED = (("sdpa", "float32"), ("sdpa", "bfloat16"), ("torch_tiled", "float16"),
          ("mutant_phantom_keys", "float32"), ("mutant_tiled_denominator_detached", "float32"))


def digest(impl, dtype: str, cases: int, profile, margins: bool = False) -> list[str]:
    lines = []

    @seed(7)
    @settings(max_examples=cases, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(attention_cases(impl.caps, dtype=dtype, profile=profile))
    def loop(case):
        judged = judge(impl, case, margins=margins)
        # A case of the CPU generator prints as before the field existed: digests of trees
        # from before it compare line for line.
        shown = repr(case).replace(", generator='torch_cpu'", "")
        lines.append(f"{impl.name} {dtype} {shown} skipped={judged.skipped!r} "
                     f"refused={judged.refused!r}")
        lines.extend(f"  {v.check} {v.passed} {v.error!r} {v.allowed!r} {v.where!r} {v.detail!r}"
                     for v in judged.verdicts)

    loop()
    return lines


_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def compare(a: list[str], b: list[str]) -> tuple[list[tuple[float, str, str]], list[tuple[str, str]]]:
    """(line pairs that differ only in numbers, with their largest relative difference, largest
    first; the other differing line pairs)."""
    if len(a) != len(b):
        return [], [(f"{len(a)} lines", f"{len(b)} lines")]
    numbers, different = [], []
    for x, y in zip(a, b):
        if x == y:
            continue
        nx, ny = _NUMBER.findall(x), _NUMBER.findall(y)
        if _NUMBER.split(x) != _NUMBER.split(y) or len(nx) != len(ny):
            different.append((x, y))
            continue
        gap = max(abs(float(p) - float(q)) / max(abs(float(p)), abs(float(q)), 1e-300)
                  for p, q in zip(nx, ny))
        numbers.append((gap, x, y))
    return sorted(numbers, reverse=True), different


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--compare":
        if len(argv) != 3:
            raise SystemExit("usage: verdict_digest.py --compare OUT OUT2")
        a, b = (Path(f).read_text().splitlines() for f in argv[1:])
        numbers, different = compare(a, b)
        for gap, x, y in numbers[:5]:
            print(f"numbers only, {gap:.3g} relative:\n- {x}\n+ {y}")
        for x, y in different:
            print(f"DIFFERENT:\n- {x}\n+ {y}")
        print(f"{len(a)} lines; {len(numbers)} differ in their numbers only (at most "
              f"{numbers[0][0] if numbers else 0:.3g} relative); {len(different)} differ otherwise",
              file=sys.stderr)
        return 1 if different else 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--cases", type=int, default=150)
    parser.add_argument("--also", action="append", default=[], metavar="IMPL:DTYPE",
                        help="judge this implementation and dtype too (after the default ones)")
    parser.add_argument("--margins", action="store_true",
                        help="judge(margins=True): every allowance the whole rule's (comparable "
                             "with trees from before the rule was decided tier by tier)")
    args = parser.parse_args(argv)
    profile = run_settings.load_profile("ci")
    if run_settings.wants_one_thread():
        torch.set_num_threads(1)
    impls = {**implementations(), **mutants()}
    lines = []
    for name, dtype in list(JUDGED) + [tuple(a.split(":")) for a in args.also]:
        kwargs = dict(margins=True) if args.margins else {}
        lines += digest(impls[name], dtype, args.cases, profile, **kwargs)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} lines, {sum(1 for l in lines if l.startswith('  grad_'))} gradient "
          f"verdicts -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
