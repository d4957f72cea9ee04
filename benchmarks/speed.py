"""Forward and backward TFLOP/s on a CUDA GPU: triton_fa2 against SDPA's fused backends, bf16.

Not a test: numbers to know, not targets. Every row is B=--batch, H=--heads, Nq = Nk = N, for each
head dim, causal and not. FLOPs: the forward's two matmuls, 4 * B * H * N * N * D, halved when
causal; the backward counts 2.5x the forward (five matmuls against two; triton_fa2's extra
recomputation in its dQ pass is not counted, so it shows as lower TFLOP/s). Times are medians of
`triton.testing.do_bench` after one untimed call.

    forward    triton_fa2 (autotuned: the first call of each shape tunes, and the chosen
               configuration is printed) against SDPA's FLASH and cuDNN backends
    backward   triton_fa2_backward given q, k, v, out, lse, dO against the FLASH backend's
               autograd backward (its graph built once); each row also compares the gradients
               with SDPA's (max error relative to the largest element) so a fast wrong kernel
               cannot look good

    python benchmarks/speed.py [--pass forward|backward|both] [--seq 1024 2048] [--head-dim 64 128]
                               [--config BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=2] [--sweep]

A row a backend cannot run (no kernel, out of memory) prints its reason and the table goes on.
Without CUDA it prints one line and exits with status 2.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import sys

FORWARD_SEQ = (1024, 2048, 4096, 8192)
BACKWARD_SEQ = (1024, 2048, 4096)
FORWARD_PROVIDERS = ("triton_fa2", "sdpa_flash", "sdpa_cudnn")
# Backward configurations --sweep tries (the full space is 192 configurations, two compiles each).
SWEEP = [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s)
         for (m, n), w, s in itertools.product(((32, 64), (64, 64), (64, 128), (128, 64),
                                                (128, 128)), (4, 8), (1, 2, 3))]


def forward_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool) -> float:
    return 4.0 * batch * heads * seq * seq * head_dim * (0.5 if causal else 1.0)


def backward_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool) -> float:
    return 2.5 * forward_flops(batch, heads, seq, head_dim, causal)


def parse_config(text: str) -> dict:
    """`BLOCK_M=64,BLOCK_N=64,...` as a backward configuration of triton_fa2_backward."""
    from fuzzattn.kernels.triton_fa2_backward import BACKWARD_CONFIG_SPACE
    config = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key.strip() not in BACKWARD_CONFIG_SPACE:
            raise argparse.ArgumentTypeError(
                f"unknown configuration key {key.strip()!r} (known: {', '.join(sorted(BACKWARD_CONFIG_SPACE))})")
        config[key.strip()] = int(value)
    return config


def _reason(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:100]


def _tiles(config) -> str:
    """An autotuner's choice as BLOCK_MxBLOCK_N, warps and stages."""
    kwargs = getattr(config, "kwargs", None)
    if not kwargs:
        return "-" if config is None else str(config)
    return (f"{kwargs.get('BLOCK_M')}x{kwargs.get('BLOCK_N')} w{getattr(config, 'num_warps', '?')} "
            f"s{getattr(config, 'num_stages', '?')}")


def forward_table(args) -> None:
    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fuzzattn.kernels.triton_fa2 import fa2_fwd_autotuned, triton_fa2_forward

    def sdpa(backend):
        def run(q, k, v, causal, scale):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, scale=scale)
        return run

    runs = {"triton_fa2": lambda q, k, v, causal, scale: triton_fa2_forward(q, k, v, causal=causal,
                                                                          scale=scale),
            "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
            "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    print(f"forward TFLOP/s, bf16 B={args.batch} H={args.heads}")
    print(f"{'N':>6} {'D':>4} {'causal':>6} " + "".join(f"{p:>12}" for p in FORWARD_PROVIDERS)
          + "  triton_fa2 config")
    for head_dim, causal, seq in itertools.product(args.head_dim, (False, True),
                                                   args.seq or FORWARD_SEQ):
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(args.batch, args.heads, seq, head_dim, device="cuda",
                               dtype=torch.bfloat16, generator=gen) for _ in range(3))
        scale = head_dim ** -0.5
        flops = forward_flops(args.batch, args.heads, seq, head_dim, causal)
        cells = []
        for provider in FORWARD_PROVIDERS:
            fn = runs[provider]
            try:
                fn(q, k, v, causal, scale)                    # untimed: autotune, compile, warm
                ms = triton.testing.do_bench(lambda: fn(q, k, v, causal, scale))
                cells.append(f"{flops / ms * 1e-9:>12.1f}")
            except Exception as error:   # noqa: BLE001  one cell's failure, not the table's
                cells.append(f"{'n/a':>12}")
                print(f"  {provider} N={seq} D={head_dim} causal={causal}: {_reason(error)}",
                      file=sys.stderr)
            torch.cuda.empty_cache()
        print(f"{seq:>6} {head_dim:>4} {str(causal):>6} " + "".join(cells)
              + f"  {_tiles(getattr(fa2_fwd_autotuned, 'best_config', None))}", flush=True)


def backward_row(args, seq: int, head_dim: int, causal: bool, configs) -> str:
    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fuzzattn.kernels.triton_fa2 import triton_fa2_forward
    from fuzzattn.kernels.triton_fa2_backward import config_invalid, default_config, triton_fa2_backward

    def bench(fn) -> float:
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    scale = 1.0 / math.sqrt(head_dim)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(args.batch, args.heads, seq, head_dim, device="cuda",
                                 dtype=torch.bfloat16, generator=gen) for _ in range(4))
    flops = backward_flops(args.batch, args.heads, seq, head_dim, causal)
    label = f"{seq:>6} {head_dim:>4} {str(causal):>6}"
    try:                                            # FLASH: forward once, time the backward
        qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out_ref = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal,
                                                                       scale=scale)
            grad = lambda: torch.autograd.grad(out_ref, (qs, ks, vs), dout, retain_graph=True)  # noqa: E731
            ref_grads = grad()
            sdpa = f"{flops / bench(grad) * 1e-9:>12.1f}"
    except Exception as error:  # noqa: BLE001
        ref_grads, sdpa = None, f"{'n/a':>12} ({_reason(error)[:60]})"
    try:
        out, lse = triton_fa2_forward(q, k, v, causal=causal, scale=scale)
    except Exception as error:  # noqa: BLE001
        return f"{label} {'forward failed':>12}{sdpa}  ({_reason(error)})"
    best = None
    for config in configs:
        if config is not None and config_invalid(config, head_dim, element_size=2):
            continue
        ours = functools.partial(triton_fa2_backward, q, k, v, out, lse, dout, causal=causal,
                                 scale=scale, config=config)
        try:
            grads = ours()
            ms = bench(ours)
        except Exception as error:  # noqa: BLE001
            if len(configs) == 1:
                return f"{label} {'failed':>12}{sdpa}  ({_reason(error)})"
            continue
        if best is None or ms < best[0]:
            best = (ms, config, grads)
    if best is None:
        return f"{label} {'no config ran':>12}{sdpa}"
    ms, config, grads = best
    shown = config if config is not None else default_config(head_dim, element_size=2)
    note = ""
    if args.check and ref_grads is not None:
        worst = max(((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()
                    for a, b in zip(grads, ref_grads))
        # bf16 gradients of two kernels: a few 1e-3 of the largest element is rounding, 5e-2 a bug
        note = f"  max rel diff vs SDPA {worst:.1e}" + ("" if worst < 5e-2 else "  MISMATCH")
    config_text = "{BLOCK_M}x{BLOCK_N} w{num_warps} s{num_stages}".format(**shown)
    return f"{label} {flops / ms * 1e-9:>12.1f}{sdpa}  {config_text:<16}{note}"


def backward_table(args) -> None:
    import torch
    configs = SWEEP if args.sweep else [args.config]
    print(f"backward TFLOP/s (2.5x the forward's FLOPs), bf16 B={args.batch} H={args.heads}")
    print(f"{'N':>6} {'D':>4} {'causal':>6} {'triton_fa2':>12}{'sdpa_flash':>12}  config")
    for head_dim, seq, causal in itertools.product(args.head_dim, args.seq or BACKWARD_SEQ,
                                                   (False, True)):
        print(backward_row(args, seq, head_dim, causal, configs), flush=True)
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pass", dest="which", choices=("forward", "backward", "both"),
                        default="both", help="which table (default both)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, nargs="+", default=None,
                        help=f"sequence lengths (default {' '.join(map(str, FORWARD_SEQ))} forward, "
                             f"{' '.join(map(str, BACKWARD_SEQ))} backward)")
    parser.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--config", type=parse_config, default=None,
                        help="backward: one configuration, e.g. BLOCK_M=64,BLOCK_N=64,num_warps=4,"
                             "num_stages=2 (default: the kernel's own for the head dim)")
    parser.add_argument("--sweep", action="store_true",
                        help="backward: the best of a small configuration sweep")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="backward: skip the gradient comparison with SDPA")
    args = parser.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("speed.py times compiled kernels on a CUDA GPU; none is visible here (nothing "
              "measured)", file=sys.stderr)
        return 2
    # Compiled kernels, whatever the environment says: TRITON_INTERPRET is read when the kernel
    # modules are first imported, below.
    os.environ["TRITON_INTERPRET"] = "0"
    import triton
    import fuzzattn  # noqa: F401  (backend selection precedes the kernels' import)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    if args.which in ("forward", "both"):
        forward_table(args)
    if args.which in ("backward", "both"):
        backward_table(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
