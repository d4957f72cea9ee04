"""How many distinct compiled Triton kernels a triton_fa2 campaign's draws need (its compile
bill), counted on the CPU without compiling anything.

Compiled Triton builds one binary per *variant*: the constexpr values (tiles, BLOCK_D, causal),
the launch options (warps, stages), the dtypes, and a specialisation class of every integer
argument (== 1, divisible by 16, other) and pointer (16-byte aligned or not) the kernel does not
exempt with do_not_specialize. Each new variant is a compile on the GPU host; a case whose
variants were all seen is a cache hit. This script draws the gpu profile's cases, builds their
tensors, and runs triton_fa2's launchers with stand-ins for the kernels that record Triton's own
specialisation key of each launch instead of launching. It prints how many distinct forward and
backward variants the first n cases need, and how many the last 100 added: a campaign whose
count keeps growing spends its time compiling. A recipe to copy for another kernel's launcher.

    python benchmarks/compile_variants.py --cases 1000 --dtype float16 [--palette 0] [--gradient-every 4]
"""
from __future__ import annotations

import argparse
import os
import sys


class _Recorder:
    """Stands in for one @triton.jit kernel: `kernel[grid](*args, **meta)` records the variant
    key Triton's JIT would look up (honouring the kernel's do_not_specialize), launches nothing."""

    def __init__(self, name: str, kernel, seen: set):
        self.name, self.seen = name, seen
        self.specialized = [not p.do_not_specialize for p in kernel.params]

    def __getitem__(self, grid):
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend

        def launch(*args, **meta):
            spec = tuple(native_specialize_impl(BaseBackend, a, False, specialize, True)[:2]
                         for a, specialize in zip(args, self.specialized))
            self.seen.add((self.name, spec, tuple(sorted(meta.items()))))
        return launch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=2000)
    p.add_argument("--gradient-every", type=int, default=4,
                   help="the campaign's setting: the backward runs on one case in this many")
    p.add_argument("--dtype", default=None, help="one dtype (a campaign's); default: all declared")
    p.add_argument("--seed", type=int, default=0, help="Hypothesis seed")
    p.add_argument("--palette", type=int, default=None,
                   help="draw layouts and configurations from this compile palette, as a campaign "
                        "on a compiled kernel does (strategies/palette.py); default: everything")
    args = p.parse_args(argv)
    # Compiled declarations (the GPU's configuration space and do_not_specialize lists), decorated
    # without a GPU: nothing here launches. TRITON_INTERPRET is read when the kernels are first
    # imported, so this counts compiled variants only in a fresh process (run it as a script).
    os.environ["TRITON_INTERPRET"] = "0"
    from hypothesis import HealthCheck, Phase, given, seed, settings

    import fuzzattn  # noqa: F401  (backend selection precedes the kernels' import)
    from fuzzattn.contract.profiles import PROFILES
    from fuzzattn.inputs.materialize import materialize, materialize_dout
    from fuzzattn.run import registry
    from fuzzattn.strategies import attention_cases

    import fuzzattn.kernels.triton_fa2 as fwd
    import fuzzattn.kernels.triton_fa2_backward as bwd
    impl = registry.get("triton_fa2")
    forward_seen: set = set()
    backward_seen: set = set()
    # The launchers refuse a CPU device when compiled; they run here only to build arguments.
    fwd.is_interpreted = bwd.is_interpreted = lambda: True
    fwd.fa2_fwd_kernel = _Recorder("forward", fwd.fa2_fwd_kernel, forward_seen)
    bwd.KERNELS = {name: _Recorder(name, kernel, backward_seen) for name, kernel in bwd.KERNELS.items()}

    counts: list[tuple[int, int, int]] = []
    extra = {} if args.palette is None else {"palette": args.palette}
    strategy = attention_cases(impl.caps, dtype=args.dtype, profile=PROFILES["gpu"], **extra)

    @seed(args.seed)
    @settings(max_examples=args.cases, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(case):
        inputs = materialize(case, "cpu")
        q, k, v = inputs.tensors()
        out, lse = impl(q, k, v, case)
        if len(counts) % args.gradient_every == 0:
            impl.gradients(q, k, v, materialize_dout(case, "cpu")[1], case, out=out, lse=lse)
        counts.append((len(counts) + 1, len(forward_seen), len(backward_seen)))

    draw()
    print(f"palette={args.palette} dtype={args.dtype or 'all'} gradient_every={args.gradient_every}")
    print("cases  forward_variants  backward_variants  (new variants per 100 cases at the end)")
    marks = [n for n in (100, 250, 500, 1000, 2000, 5000, 10000) if n <= len(counts)] + [len(counts)]
    for n in sorted(set(marks)):
        _, f, b = counts[n - 1]
        prev = counts[max(0, n - 101)]
        print(f"{n:6d}  {f:16d}  {b:17d}  (+{f - prev[1]} / +{b - prev[2]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
