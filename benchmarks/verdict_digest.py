"""Every verdict of a fixed set of judgements, one line each, to show that a change to the judge
or its speed changed no verdict: write a digest on each tree and compare them.

    python benchmarks/verdict_digest.py OUT [--cases 150] [--margins] [--also IMPL:DTYPE]
    python benchmarks/verdict_digest.py OUT2     # in the other tree, after its pip install -e .
    python benchmarks/verdict_digest.py --compare OUT OUT2         # or `cmp OUT OUT2`

Judged: sdpa (float32, bfloat16), torch_tiled (float16) and two mutants that fail in different
checks (phantom keys: the values; a detached denominator: the gradients), each on the same
--cases cases of the ci profile (Hypothesis seed 7), gradients on every case. A line holds a
verdict's check, passed, error, allowed, where and detail by repr, so a last-digit change shows.
--margins judges with margins=True: every allowance is the whole rule's, whichever tier would
have decided the pass, so digests compare across a change to how the tiers decide.

--compare is for a change that moves float64 arithmetic: lines that differ only in their numbers
pass, the largest relative differences among them are printed for a look, and every line that
differs otherwise (a check, a verdict, a place, a case) is printed and makes the exit status 1.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import fuzzattn  # noqa: F401  (selects the Triton backend first)
from hypothesis import HealthCheck, given, seed, settings

from fuzzattn import settings as run_settings
from fuzzattn.judgement.judge import judge
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", help="the digest to write")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("OUT", "OUT2"),
                        help="instead: compare two digests (exit 1 if a line differs otherwise "
                             "than in its numbers)")
    parser.add_argument("--cases", type=int, default=150, help="cases per judged row (default 150)")
    parser.add_argument("--also", action="append", default=[], metavar="IMPL:DTYPE",
                        help="judge this implementation and dtype too (after the default ones)")
    parser.add_argument("--margins", action="store_true",
                        help="judge(margins=True): every allowance the whole rule's")
    args = parser.parse_args(argv)
    if args.compare:
        a, b = (path.read_text().splitlines() for path in args.compare)
        numbers, different = compare(a, b)
        for gap, x, y in numbers[:5]:
            print(f"numbers only, {gap:.3g} relative:\n- {x}\n+ {y}")
        for x, y in different:
            print(f"DIFFERENT:\n- {x}\n+ {y}")
        print(f"{len(a)} lines; {len(numbers)} differ in their numbers only (at most "
              f"{numbers[0][0] if numbers else 0:.3g} relative); {len(different)} differ otherwise",
              file=sys.stderr)
        return 1 if different else 0
    if args.out is None:
        parser.error("OUT is required (or --compare OUT OUT2)")
    profile = run_settings.load_profile("ci")
    impls = {**implementations(), **mutants()}
    lines = []
    with run_settings.one_cpu_thread():
        for name, dtype in list(JUDGED) + [tuple(a.split(":")) for a in args.also]:
            lines += digest(impls[name], dtype, args.cases, profile, margins=args.margins)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} lines, {sum(1 for line in lines if line.startswith('  grad_'))} gradient "
          f"verdicts -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
