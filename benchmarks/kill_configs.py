"""Which configurations of triton_fa2 kill each tile-shape mutant, and after how many cases.

Not a test: it prints a table. Each mutant is fuzzed once per configuration of a small sample,
with every call pinned to that configuration (what the engine will do once cases carry a drawn
`config`): `fuzz(pinned, attention_cases(caps, dtype=...), max_examples=60, save_to_file=False)`. A cell
reads "killed@N" (the first failing case was the N-th judged) or "survived" (60 cases passed).
Runs under the interpreter on CPU in a few minutes; on a GPU the same calls run compiled.

    python benchmarks/kill_configs.py [--dtype float32] [--cases 60] [--top-left-only] [--mutant NAME ...]
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time

import fuzzattn  # noqa: F401  (selects Triton's backend before any kernel module loads)
from fuzzattn.campaigns.campaign import fuzz
from fuzzattn.run.registry import mutants
from fuzzattn.strategies import attention_cases

# The baseline, one tile shape each side of square, and a large square tile.
SAMPLE = (
    {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
    {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
    {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1},
)
CONFIG_MUTANTS = ("mutant_diagonal_bounds_block_m_lt_n", "mutant_maskfree_ragged_tail",
                  "mutant_skip_off_by_one_block", "mutant_lse_base2")


def label(config: dict) -> str:
    return f"{config['BLOCK_M']}x{config['BLOCK_N']}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--cases", type=int, default=60, help="max_examples per (mutant, config)")
    parser.add_argument("--top-left-only", action="store_true",
                        help="draw causal cases top-left only (no bottom-right offsets): what is "
                             "left shows the tile shapes alone")
    parser.add_argument("--mutant", action="append", help="only these mutants (default: the tile-"
                        "shape ones and lse_base2)")
    args = parser.parse_args(argv)
    zoo = mutants()
    names = args.mutant or list(CONFIG_MUTANTS)
    print(f"dtype={args.dtype}, max_examples={args.cases}, same seed for every cell"
          + (", causal cases top-left only" if args.top_left_only else ""))
    print(f"{'mutant':<38}" + "".join(f"{label(c):>14}" for c in SAMPLE) + f"{'seconds':>9}")
    for name in names:
        mutant = zoo[name]
        cells, start = [], time.perf_counter()
        for config in SAMPLE:
            pinned = dataclasses.replace(mutant, fn=functools.partial(mutant.fn, config=config))
            caps = mutant.caps
            if args.top_left_only:
                caps = dataclasses.replace(caps, causal=("top_left",))
            result = fuzz(pinned, attention_cases(caps, dtype=args.dtype),
                          max_examples=args.cases, save_to_file=False,
                          shrink=False)   # the count to the first failure is all we print
            cells.append("survived" if result.passed else
                         "error" if result.error else f"killed@{result.cases_to_first_failure}")
        print(f"{name:<38}" + "".join(f"{c:>14}" for c in cells)
              + f"{time.perf_counter() - start:>9.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
