"""Pin an `@triton.autotune`d kernel to one of its configurations, to test each one.

An autotuned kernel runs whichever configuration won its benchmark on the machine at hand, so
a test of it tests one configuration, a different one on another GPU. A configuration-specific
bug (a tile-edge condition that only BLOCK_M < BLOCK_N reaches) then passes every test here and
fails in production. The recipe, for a kernel decorated like

    @triton.autotune(configs=[triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4,
                                            num_stages=2), ...], key=["N"])
    @triton.jit
    def my_kernel(X, Y, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD: tl.constexpr): ...

1. List what it can run:      `configs(my_kernel)` -> [{"BLOCK_M": 64, "BLOCK_N": 32,
                               "num_warps": 4, "num_stages": 2}, ...], plain dicts, printable and
                               usable as test ids or as draws of a fuzzer.
2. Launch exactly one:         `launch_pinned(my_kernel, grid, x, y, n, config=cfg, HEAD=16)`
                               launches `my_kernel.fn[grid](x, y, n, HEAD=16, BLOCK_M=64,
                               BLOCK_N=32, num_warps=4, num_stages=2)`: the undecorated kernel
                               with that configuration's meta-parameters and launch options, as
                               the autotuner would launch its winner (a Config's `pre_hook`
                               runs first, `num_ctas` / `maxnreg` pass through).
3. Test each:                  parametrize over `configs(my_kernel)` and compare with a reference,
                               or let fuzzattn draw them: `Capabilities(..., **declare(my_kernel))`
                               declares the configurations as a space (one axis per name, the
                               autotuner's first configuration first) whose rule allows exactly
                               the listed combinations; the fuzzer then draws, shrinks, records
                               and replays them, and calls your function with `config=<dict>`.

The autotuner itself is left as it was: its configs, its cache of winners and its timings are
not touched, so the production path (`my_kernel[grid](...)`) behaves the same before and after.
`grid` may be a tuple or a callable of the launch's meta-parameters (`lambda meta:
(triton.cdiv(n, meta["BLOCK_M"]),)`), as for any Triton launch. kernels/triton_fa2.py is the
worked example: `triton_fa2_forward(..., config=...)` pins, `config=None` autotunes.
"""
from __future__ import annotations

__all__ = ["config_dict", "configs", "declare", "launch_pinned"]

# Launch options a triton.Config carries beside its meta-parameters; the dicts here name the two
# every configuration sets, the others pass through from the matching Config when set.
_LAUNCH_OPTIONS = ("num_warps", "num_stages")


def config_dict(config) -> dict:
    """One `triton.Config` as a plain dict: its meta kwargs, num_warps and num_stages."""
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


def configs(autotuner) -> list[dict]:
    """The autotuner's configurations, in its order, as plain dicts (see `config_dict`)."""
    return [config_dict(c) for c in autotuner.configs]


def launch_pinned(autotuner, grid, *args, config: dict, **kwargs):
    """Launch `autotuner`'s kernel with exactly `config` (one of `configs(autotuner)`).

    `args` / `kwargs` are what the autotuned kernel is normally called with (everything but the
    tuned meta-parameters). Raises ValueError for a config the autotuner does not list, or for a
    kwarg that the config also sets (the autotuner refuses the same conflict).
    """
    match = next((c for c in autotuner.configs if config_dict(c) == config), None)
    if match is None:
        raise ValueError(f"config {config!r} is not one of the autotuner's {len(autotuner.configs)} "
                         f"configurations (see fuzzattn.contract.autotune.configs)")
    conflicts = sorted(set(kwargs) & set(match.all_kwargs()))
    if conflicts:
        raise ValueError(f"{', '.join(conflicts)} given both as a launch argument and by the config")
    launch = match.all_kwargs()          # meta kwargs + num_warps/num_stages (+ num_ctas, maxnreg)
    if match.pre_hook is not None:
        # The hook sees the named arguments, as under the autotuner (autotuner.arg_names order).
        match.pre_hook({**dict(zip(autotuner.arg_names, args)), **kwargs, **launch})
    return autotuner.fn[grid](*args, **kwargs, **launch)


def declare(autotuner, *, prune_compile_errors: bool = True) -> dict:
    """Capabilities keyword arguments declaring the autotuner's configurations as a space:
    `configs` (each name's values in first-seen order, so shrinking moves toward the first
    configuration), `config_rule`, which allows exactly the listed combinations, and
    `prune_compile_errors`: a configuration failing to compile for a case with an error the
    autotuner skips is pruned for that case as the autotuner would (False: such errors are
    crashes; see fuzzattn/run/pruning.py)."""
    if not isinstance(prune_compile_errors, bool):
        raise TypeError(f"prune_compile_errors={prune_compile_errors!r} must be True or False")
    listed = configs(autotuner)
    axes: dict[str, list] = {}
    for config in listed:
        for name, value in config.items():
            if value not in axes.setdefault(name, []):
                axes[name].append(value)
    allowed = {tuple(sorted(c.items())) for c in listed}

    def rule(config: dict, case) -> str | None:
        if tuple(sorted(config.items())) not in allowed:
            return "not one of the autotuner's configurations"
        return None

    return {"configs": {name: tuple(values) for name, values in axes.items()}, "config_rule": rule,
            "prune_compile_errors": prune_compile_errors}
