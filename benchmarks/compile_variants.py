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
count keeps growing spends its time compiling. Then which axis multiplies the variants (how
many there would be were that axis one value), and how much of what the kernel declares the
cases covered. A recipe to copy for another kernel's launcher.

With --rotate-every R the campaign moves to its next palette every R cases, as a rotating
campaign does (fuzzattn/campaigns/rotation.py): palette, palette + shards, palette + 2 shards...

    python benchmarks/compile_variants.py --cases 1000 --dtype float16 [--palette 0] [--gradient-every 4]
    python benchmarks/compile_variants.py --cases 4000 --dtype float16 --palette 0 --rotate-every 500 --shards 16
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

# The parts of a variant key, by what in a case decides them: (axis, its part of the key).
AXES = ("config", "head dim (BLOCK_D)", "variant flags", "dtype", "pointer alignment",
        "row/element strides")
CONFIG_NAMES = {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}
FLAG_NAMES = {"IS_CAUSAL", "HAS_LEFT", "SOFTCAP"}


class _Recorder:
    """Stands in for one @triton.jit kernel: `kernel[grid](*args, **meta)` records the variant
    key Triton's JIT would look up (honouring the kernel's do_not_specialize), launches nothing.
    A key is (kernel, axis -> that axis's part), so the count can be broken down by axis."""

    def __init__(self, name: str, kernel, seen: set):
        self.name, self.seen = name, seen
        self.params = [(p.name, not p.do_not_specialize) for p in kernel.params]

    def __getitem__(self, grid):
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend

        def launch(*args, **meta):
            parts = collections.defaultdict(list)
            for (name, specialize), arg in zip(self.params, args):
                kind, klass = native_specialize_impl(BaseBackend, arg, False, specialize, True)[:2]
                if kind.startswith("*"):
                    parts["dtype"].append(kind)
                    parts["pointer alignment"].append((name, klass))
                elif specialize:
                    parts["row/element strides"].append((name, kind, klass))
            for name, value in sorted(meta.items()):
                axis = ("config" if name in CONFIG_NAMES else "variant flags" if name in FLAG_NAMES
                        else "head dim (BLOCK_D)")
                parts[axis].append((name, value))
            self.seen.add((self.name, tuple((axis, tuple(parts[axis])) for axis in AXES)))
        return launch


def breakdown(seen: set) -> list[tuple[str, int, int]]:
    """(axis, its distinct parts, variants were it one value) for every axis of `seen`'s keys."""
    rows = []
    for i, axis in enumerate(AXES):
        values = {(name, key[i][1]) for name, key in seen}
        without = {(name, key[:i] + key[i + 1:]) for name, key in seen}
        rows.append((axis, len(values), len(without)))
    return rows


def coverage(cases: list, caps, dtype: str | None) -> list[tuple[str, int, int]]:
    """(axis, choices declared, choices seen in `cases`) for the axes a palette narrows."""
    from fuzzattn.strategies.cases import variant_combinations
    from fuzzattn.strategies.layouts import layout_choices
    from fuzzattn.strategies.lengths import head_dim_choices
    from fuzzattn.strategies.palette import dim_class

    dims = head_dim_choices(caps.head_dims, max_head_dim=caps.max_head_dim)
    combos = variant_combinations(caps)
    rows = [("head dim", len(dims), len({c.head_dim for c in cases})),
            ("head dim class (BLOCK_D)", len({dim_class(d) for d in dims}),
             len({dim_class(c.head_dim) for c in cases})),
            ("layout (q, k, v)", len(layout_choices(caps)), len({c.layout for c in cases})),
            ("variant combination", len(combos), len({_combo(c) for c in cases})),
            ("causal", 1 + len(caps.causal), len({c.causal for c in cases})),
            ("dtype", len(caps.dtypes) if dtype is None else 1, len({c.dtype for c in cases}))]
    for name, choices in caps.configs:
        rows.append((f"config {name}", len(choices),
                     len({dict(c.config).get(name) for c in cases} - {None})))
    return rows


def _combo(case) -> tuple[str, ...]:
    on = {"window": case.windowed, "softcap": bool(case.softcap), "alibi": bool(case.alibi),
          "paged_kv": bool(case.paged_kv)}
    return tuple(name for name, flag in on.items() if flag)


def _arguments(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=2000)
    p.add_argument("--gradient-every", type=int, default=4,
                   help="the campaign's setting: the backward runs on one case in this many")
    p.add_argument("--dtype", default=None, help="one dtype (a campaign's); default: all declared")
    p.add_argument("--seed", type=int, default=0, help="Hypothesis seed")
    p.add_argument("--palette", type=int, default=None,
                   help="draw layouts, head dim classes and configurations from this compile "
                        "palette, as a campaign on a compiled kernel does (strategies/palette.py); "
                        "default: everything")
    p.add_argument("--rotate-every", type=int, default=None, metavar="R",
                   help="move to the next palette every R cases (needs --palette)")
    p.add_argument("--shards", type=int, default=1, metavar="W",
                   help="the campaign's shards: palettes step by W, so shards never share one")
    args = p.parse_args(argv)
    if args.rotate_every is not None and (args.palette is None or args.rotate_every < 1):
        p.error(f"--rotate-every {args.rotate_every} needs --palette and a positive R")
    if args.shards < 1:
        p.error(f"--shards {args.shards} must be at least 1")
    return args


def main(argv=None) -> int:
    args = _arguments(argv)
    # Compiled declarations (the GPU's configuration space and do_not_specialize lists), decorated
    # without a GPU: nothing here launches. TRITON_INTERPRET is read when the kernels are first
    # imported, so this counts compiled variants only in a fresh process (run it as a script).
    os.environ["TRITON_INTERPRET"] = "0"
    from hypothesis import HealthCheck, Phase, given, seed, settings

    import fuzzattn  # noqa: F401  (backend selection precedes the kernels' import)
    from fuzzattn.campaigns.rotation import PaletteRotation
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
    cases: list = []
    rotation = (PaletteRotation(args.palette, args.shards, args.rotate_every)
                if args.rotate_every else None)

    def judge(case):
        inputs = materialize(case, "cpu")
        q, k, v = inputs.tensors()
        out, lse = impl(q, k, v, case)
        if len(counts) % args.gradient_every == 0:
            impl.gradients(q, k, v, materialize_dout(case, "cpu")[1], case, out=out, lse=lse)
        cases.append(case)
        counts.append((len(counts) + 1, len(forward_seen), len(backward_seen)))

    turn = 0
    while len(counts) < args.cases:      # one Hypothesis run a palette, as a campaign's rounds
        palette = args.palette if rotation is None else rotation.palette(turn)
        quota = args.cases - len(counts) if rotation is None else min(
            rotation.every, args.cases - len(counts))
        extra = {} if palette is None else {"palette": palette}
        strategy = attention_cases(impl.caps, dtype=args.dtype, profile=PROFILES["gpu"], **extra)
        seed(args.seed + turn)(settings(
            max_examples=quota, database=None, deadline=None, phases=[Phase.generate],
            suppress_health_check=list(HealthCheck))(given(strategy)(judge)))()
        turn += 1
    _report(args, counts, forward_seen | backward_seen, forward_seen, cases, impl.caps, turn)
    return 0


def _report(args, counts, seen, forward_seen, cases, caps, turns) -> None:
    print(f"palette={args.palette} dtype={args.dtype or 'all'} gradient_every={args.gradient_every}"
          + (f" rotate_every={args.rotate_every} shards={args.shards} palettes={turns}"
             if args.rotate_every else ""))
    print("cases  forward_variants  backward_variants  (new variants per 100 cases at the end)")
    marks = [n for n in (100, 250, 500, 1000, 2000, 5000, 10000) if n <= len(counts)] + [len(counts)]
    for n in sorted(set(marks)):
        _, f, b = counts[n - 1]
        prev = counts[max(0, n - 101)]
        print(f"{n:6d}  {f:16d}  {b:17d}  (+{f - prev[1]} / +{b - prev[2]})")
    total = counts[-1][1] + counts[-1][2]
    print(f"forward+backward variants per 1,000 cases: {1000 * total / len(counts):.1f}")
    print(f"\n{'axis':22s} {'distinct parts':>14s} {'variants were it one value':>27s}"
          f"  (of {len(seen)} forward+backward)")
    for axis, parts, without in breakdown(seen):
        print(f"{axis:22s} {parts:14d} {without:27d}")
    print(f"\n{'axis':26s} {'choices declared':>16s} {'seen in %d cases' % len(cases):>18s}")
    for axis, declared, seen_here in coverage(cases, caps, args.dtype):
        print(f"{axis:26s} {declared:16d} {seen_here:18d}")


if __name__ == "__main__":
    sys.exit(main())
