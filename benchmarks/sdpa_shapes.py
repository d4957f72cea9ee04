"""What a stream of new shapes costs SDPA, per dtype and backend: a shape's first call against
later calls of the same shape.

    python benchmarks/sdpa_shapes.py --shapes 30 --repeats 3 --device cuda

A fuzzer hands SDPA a new (B, H, Nq, Nk, D) nearly every case. For each dtype and each backend
that runs here (the default dispatch, then flash, efficient, cudnn and math forced), this draws
--shapes random shapes and times forward + backward on each shape's first call and on --repeats
later calls of the same shape, and prints the median milliseconds of both with the backend the
default dispatch chose. A first call far slower than a repeat is a cost paid per shape (a plan
built or tuned per shape), which only a palette of shapes amortises; a repeat as slow is the
kernel itself.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "math": SDPBackend.MATH}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _shapes(count: int, seed: int, device: str) -> list[tuple[int, int, int, int, int]]:
    rng = random.Random(seed)
    top = 512 if device == "cuda" else 64
    return [(rng.randint(1, 4), rng.randint(1, 8), rng.randint(1, top), rng.randint(1, top),
             rng.choice((16, 32, 64, 128))) for _ in range(count)]


def _step(shape, dtype, device, backend) -> float:
    """Seconds for one forward and backward of `shape` under `backend` (None: default dispatch)."""
    b, h, nq, nk, d = shape
    q = torch.randn(b, h, nq, d, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(b, h, nk, d, dtype=dtype, device=device, requires_grad=True)
    v = torch.randn(b, h, nk, d, dtype=dtype, device=device, requires_grad=True)
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    if backend is None:
        out = F.scaled_dot_product_attention(q, k, v)
    else:
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q, k, v)
    out.sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def _chosen(shape, dtype, device) -> str:
    """The backend the default dispatch picks for `shape` (torch's private chooser, where it
    exists)."""
    choose = getattr(torch._C, "_fused_sdp_choice", None) or getattr(torch, "_fused_sdp_choice",
                                                                     None)
    if choose is None:
        return "?"
    b, h, nq, nk, d = shape
    q = torch.empty(b, h, nq, d, dtype=dtype, device=device, requires_grad=True)
    k = torch.empty(b, h, nk, d, dtype=dtype, device=device, requires_grad=True)
    try:
        return SDPBackend(choose(q, k, k, None, 0.0, False)).name
    except Exception as error:      # the chooser's signature changes between torch versions
        return f"? ({type(error).__name__})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=int, default=30, help="new shapes per dtype and backend")
    parser.add_argument("--repeats", type=int, default=3, help="later calls timed per shape")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--seed", type=int, default=0, help="which shapes are drawn")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__} on {args.device}; {args.shapes} shapes, "
          f"{args.repeats} repeats each")
    print(f"{'dtype':9} {'backend':10} {'first ms':>9} {'repeat ms':>9} {'ratio':>6}  chosen")
    for name in args.dtypes.split(","):
        dtype = DTYPES[name]
        for index, (backend_name, backend) in enumerate(BACKENDS.items()):
            # Shapes of their own per backend: no backend finds another's per-shape plans.
            shapes = _shapes(args.shapes, args.seed + index, args.device)
            chosen = sorted({_chosen(s, dtype, args.device) for s in shapes}) if index == 0 else []
            first, repeat = [], []
            try:
                for shape in shapes:
                    first.append(_step(shape, dtype, args.device, backend))
                    repeat.extend(_step(shape, dtype, args.device, backend)
                                  for _ in range(args.repeats))
            except RuntimeError as error:
                print(f"{name:9} {backend_name:10} refused: {str(error).splitlines()[0][:70]}")
                continue
            f_ms, r_ms = (1e3 * statistics.median(t) for t in (first, repeat))
            print(f"{name:9} {backend_name:10} {f_ms:9.2f} {r_ms:9.2f} {f_ms / r_ms:6.1f}  "
                  f"{','.join(chosen)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
