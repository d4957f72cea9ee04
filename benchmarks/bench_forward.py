"""Forward TFLOP/s on a CUDA GPU: triton_fa2 (autotuned) against SDPA's FLASH and cuDNN backends.

Not a test: it prints a table. bf16, B=4, H=16, N in 1024/2048/4096/8192, D 64 and 128, causal
and not. FLOPs = 4 * B * H * N * N * D (two matmuls of 2 * N * N * D each), halved when causal
(only the visible half of the scores is work). Times are the median of `triton.testing.do_bench`
after one untimed call; the first triton_fa2 call of each (N, D, causal) key autotunes over
every valid configuration (minutes in all, compiles shared across keys), so the table also
prints the configuration the autotuner chose. A backend that cannot run a row prints its reason
("No available kernel", out of memory) in that cell instead of stopping the table.

    python benchmarks/bench_forward.py [--seq 1024 2048 4096 8192] [--head-dim 64 128]
"""
from __future__ import annotations

import argparse
import sys

import torch

PROVIDERS = ("triton_fa2", "sdpa_flash", "sdpa_cudnn")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_forward.py measures compiled kernels and needs a CUDA GPU; none is visible "
              "(torch.cuda.is_available() is False). Run it on the GPU machine.", file=sys.stderr)
        return 2

    import fuzzattn  # noqa: F401  (backend selection must precede the kernel import)
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fuzzattn.kernels.triton_fa2 import fa2_fwd_autotuned, triton_fa2_forward

    def sdpa(backend):
        def run(q, k, v, causal, scale):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, scale=scale)
        return run

    def triton_run(q, k, v, causal, scale):
        return triton_fa2_forward(q, k, v, causal=causal, scale=scale)

    runs = {"triton_fa2": triton_run, "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
            "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"bf16 B={args.batch} H={args.heads}; TFLOP/s (median of do_bench)")
    print(f"{'N':>6} {'D':>4} {'causal':>6} " + "".join(f"{p:>14}" for p in PROVIDERS)
          + "  triton_fa2 config")
    for head_dim in args.head_dim:
        for causal in (False, True):
            for seq in args.seq:
                shape = (args.batch, args.heads, seq, head_dim)
                gen = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
                           for _ in range(3))
                scale = head_dim ** -0.5
                flops = 4 * args.batch * args.heads * seq * seq * head_dim * (0.5 if causal else 1.0)
                cells = []
                for provider in PROVIDERS:
                    fn = runs[provider]
                    try:
                        fn(q, k, v, causal, scale)            # untimed: autotune / compile / warm
                        ms = triton.testing.do_bench(lambda: fn(q, k, v, causal, scale))
                        cells.append(f"{flops / ms * 1e-9:>14.1f}")
                    except Exception as error:   # noqa: BLE001  one row's failure is a cell, not the end
                        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                        cells.append(f"{'n/a':>14}")
                        print(f"  {provider} N={seq} D={head_dim} causal={causal}: {reason[:100]}",
                              file=sys.stderr)
                    torch.cuda.empty_cache()
                best = getattr(fa2_fwd_autotuned, "best_config", None)
                print(f"{seq:>6} {head_dim:>4} {str(causal):>6} " + "".join(cells)
                      + f"  {best if best is not None else '-'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
