"""Backward TFLOP/s of triton_fa2_backward against SDPA's FLASH_ATTENTION backward, on a GPU.

bf16, B=4, H=16, N in 1024/2048/4096, D in 64/128, causal and not (Nq = Nk, so the two causal
alignments coincide). FLOPs are counted the usual FA2 way: forward 4*B*H*N*N*D (two matmuls of
2*N*N*D per head), halved when causal; backward 2.5x the forward (five matmuls against two; the
extra recomputation in our dQ pass is *not* counted, so it shows up as lower TFLOP/s).

Only the backward is timed: for ours, the three kernels given q, k, v, out, lse, dout (out and
lse come once from the project's Triton forward); for SDPA, torch.autograd.grad through a graph
built once under `sdpa_kernel(SDPBackend.FLASH_ATTENTION)`. Times are medians from
triton.testing.do_bench. Each row also checks our gradients against SDPA's (max error relative
to the largest gradient element) so a fast wrong kernel cannot look good.

    python benchmarks/bench_backward.py [--n 1024 2048] [--d 64] [--config BLOCK_M=64,BLOCK_N=64,
                                         num_warps=4,num_stages=2] [--sweep] [--no-check]

Without CUDA it prints one line and exits with status 2. A row that fails (OOM, compile error,
a backend with no kernel for the case) prints its error and the other rows still run.
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
import sys

# A GPU benchmark must time compiled kernels: never let an inherited TRITON_INTERPRET pick the
# interpreter (it is read when the kernel modules are imported, below).
os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402

# Checked before importing the project: on a CPU machine fuzzattn would select the interpreter.
if not torch.cuda.is_available():
    print("bench_backward: CUDA is not available; this benchmark times compiled Triton kernels "
          "on a GPU (nothing measured)", file=sys.stderr)
    raise SystemExit(2)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root

import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import fuzzattn  # noqa: E402,F401
from fuzzattn.kernels.triton_fa2 import triton_fa2_forward  # noqa: E402
from fuzzattn.kernels.triton_fa2_backward import (BACKWARD_CONFIG_SPACE, config_invalid,  # noqa: E402
                                         default_config, triton_fa2_backward)

# A few configs for --sweep (the full space is 192 configs x 2 compiles per shape: too slow).
SWEEP = [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s)
         for (m, n), w, s in itertools.product(((32, 64), (64, 64), (64, 128), (128, 64),
                                                (128, 128)), (4, 8), (1, 2, 3))]


def parse_config(text: str) -> dict:
    config = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key.strip() not in BACKWARD_CONFIG_SPACE:
            raise SystemExit(f"bench_backward: unknown config key {key!r} "
                             f"(known: {sorted(BACKWARD_CONFIG_SPACE)})")
        config[key.strip()] = int(value)
    return config


def backward_flops(batch, heads, seq, head_dim, causal) -> float:
    forward = 4.0 * batch * heads * seq * seq * head_dim
    return 2.5 * (forward / 2 if causal else forward)


def bench(fn) -> float:
    """Median milliseconds of fn() (do_bench flushes L2 between runs)."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def run_row(batch, heads, seq, head_dim, causal, configs, check) -> str:
    scale = 1.0 / math.sqrt(head_dim)
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn():
        return torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16,
                           generator=g)

    q, k, v, dout = randn(), randn(), randn(), randn()
    flops = backward_flops(batch, heads, seq, head_dim, causal)
    label = f"{seq:>5} {head_dim:>4} {str(causal):>6}"

    # SDPA FLASH: forward once (graph kept), time the backward alone.
    try:
        qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out_ref = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale)
            ref_grads = torch.autograd.grad(out_ref, (qs, ks, vs), dout, retain_graph=True)
            ms = bench(lambda: torch.autograd.grad(out_ref, (qs, ks, vs), dout, retain_graph=True))
        sdpa = f"{flops / ms / 1e9:>9.1f}"
    except Exception as exc:  # noqa: BLE001 - one failed row must not stop the others
        ref_grads, sdpa = None, f"{'n/a':>9} ({type(exc).__name__}: {str(exc).splitlines()[0][:60]})"

    try:
        out, lse = triton_fa2_forward(q, k, v, causal=causal, scale=scale)
    except Exception as exc:  # noqa: BLE001
        return f"{label} {'forward failed':>22}  {sdpa}  ({type(exc).__name__}: {exc})"

    best = None
    for config in configs:
        if config is not None and config_invalid(config, head_dim, element_size=2):
            continue
        try:
            def ours(config=config):
                return triton_fa2_backward(q, k, v, out, lse, dout, causal=causal, scale=scale,
                                           config=config)
            grads = ours()
            ms = bench(ours)
        except Exception as exc:  # noqa: BLE001
            if len(configs) == 1:
                return (f"{label} {'failed':>9}  {sdpa}  "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0][:100]})")
            continue
        if best is None or ms < best[0]:
            best = (ms, config, grads)
    if best is None:
        return f"{label} {'no config ran':>9}  {sdpa}"
    ms, config, grads = best
    shown = config if config is not None else default_config(head_dim, element_size=2)
    cfg = "{BLOCK_M}x{BLOCK_N} w{num_warps} s{num_stages}".format(**shown)
    note = ""
    if check and ref_grads is not None:
        errors = [((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()
                  for a, b in zip(grads, ref_grads)]
        # bf16 gradients from two different kernels: a few 1e-3 relative to the largest element
        # is rounding; 5e-2 is a wrong gradient.
        worst = max(errors)
        note = f"  max rel diff vs SDPA {worst:.1e}" + ("  MISMATCH" if not worst < 5e-2 else "")
    return f"{label} {flops / ms / 1e9:>9.1f}  {sdpa}  {cfg:<16}{note}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--d", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--config", type=parse_config, default=None,
                        help="one config, e.g. BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=2")
    parser.add_argument("--sweep", action="store_true", help="best of a small config sweep")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip the gradient comparison against SDPA")
    args = parser.parse_args(argv)
    configs = SWEEP if args.sweep else [args.config]

    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  "
          f"bf16 B={args.batch} H={args.heads}; backward TFLOP/s (2.5x forward FLOPs)")
    print(f"{'N':>5} {'D':>4} {'causal':>6} {'triton':>9}  {'sdpa':>9}  {'config':<16}")
    for head_dim, seq, causal in itertools.product(args.d, args.n, (False, True)):
        print(run_row(args.batch, args.heads, seq, head_dim, causal, configs, args.check),
              flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
