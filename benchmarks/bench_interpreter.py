"""Seconds for three interpreted triton_fa2 forwards over four fixed cases: an A/B of interpreter
changes (fuzzattn/triton_interpreter/speed.py). Run it alternately on the two trees being
compared, several times each, on one machine: its speed drifts too much for one pair of runs.

    TRITON_INTERPRET=1 python benchmarks/bench_interpreter.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fuzzattn  # noqa: E402,F401  (selects the interpreter before triton loads)
from fuzzattn import AttentionCase  # noqa: E402
from fuzzattn.inputs.materialize import materialize  # noqa: E402
from fuzzattn.kernels.triton_fa2 import triton_fa2_forward  # noqa: E402

CASES = (AttentionCase(2, 4, 2, 37, 45, 64, causal="bottom_right"),
         AttentionCase(1, 2, 2, 100, 70, 32),
         AttentionCase(1, 1, 1, 17, 130, 16, causal="top_left"),
         AttentionCase(3, 2, 1, 64, 64, 128))


def main() -> None:
    inputs = [materialize(case).tensors() for case in CASES]
    triton_fa2_forward(*inputs[0], causal="bottom_right", scale=0.125)      # warm-up
    start = time.perf_counter()
    for _ in range(3):
        for case, (q, k, v) in zip(CASES, inputs):
            triton_fa2_forward(q, k, v, causal=case.causal if case.causal != "none" else False,
                               scale=case.softmax_scale)
    print(f"{time.perf_counter() - start:.2f}")


if __name__ == "__main__":
    main()
