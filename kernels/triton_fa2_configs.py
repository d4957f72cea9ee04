"""Configurations of the Triton FlashAttention-2 kernels: the spaces, which points of them run a
head dim on sm_90 (Hopper), and the forward's autotuning list.

A configuration is one choice per axis of a space: tile sizes, warps, pipeline stages. The first
choice of every axis is the simplest; together they are the article's kernel (16x16 tiles, 4
warps, no pipelining), which a shrinking fuzzer reaches by shrinking each axis to its first
choice. The forward runs a point of CONFIG_SPACE (kernels/triton_fa2.py), the backward one of
BACKWARD_CONFIG_SPACE (kernels/triton_fa2_backward.py). A fuzzed case draws both: the forward's
axes under their own names, the backward's with a "bwd_" prefix (BACKWARD_CONFIGS), and
`forward_and_backward_rule` leaves out the combinations that would not fit.
"""
from __future__ import annotations

import itertools

import torch
import triton

from fuzzattn.contract import KnownDefect, autotune, refuse
from fuzzattn.triton_interpreter.backend import ensure_backend, is_interpreted

# BACKWARD_CONFIGS below depends on the backend: choose it before reading it.
ensure_backend()

MAX_HEAD_DIM = 256     # largest D verified, interpreted and compiled (docs/CALIBRATION.md#head-dim)

# Resource limits of sm_90 (Hopper) that decide whether a configuration compiles and runs.
SMEM_LIMIT_BYTES = 227 * 1024      # opt-in shared memory per thread block on sm_90
REGISTER_BUDGET = 192              # fp32 tile values per thread we allow (of 255 registers)

# -- the forward ---------------------------------------------------------------------------------
CONFIG_SPACE = {
    "BLOCK_M": (16, 32, 64, 128),      # query rows per program
    "BLOCK_N": (16, 32, 64, 128),      # keys per inner-loop step
    "num_warps": (4, 1, 2, 8),
    "num_stages": (1, 2, 3),           # K/V tiles in flight (software pipelining of the loops)
}
BASELINE_CONFIG = {axis: choices[0] for axis, choices in CONFIG_SPACE.items()}

# The whole space, baseline first: what the fuzzer draws from.
ALL_CONFIGS = [dict(zip(CONFIG_SPACE, values)) for values in itertools.product(*CONFIG_SPACE.values())]
# What the autotuner times when the caller names no configuration: a dozen of the shapes fast
# Hopper attention kernels use, as real kernels list a handful rather than the whole space
# (timing all ~190 would compile each of them for every size key). Which of these fit a head dim
# is decided per call by the prune below; the fuzzer still draws from ALL_CONFIGS.
AUTOTUNE_CONFIGS = [dict(zip(CONFIG_SPACE, values)) for values in (
    (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 32, 4, 3), (128, 64, 4, 2),
    (128, 128, 8, 2), (64, 64, 4, 3), (64, 64, 4, 2), (64, 128, 4, 2), (64, 32, 4, 3),
    (64, 64, 8, 3), (32, 32, 4, 2))]


def block_d(head_dim: int) -> int:
    """The head dim padded for tl.dot, which wants K >= 16 and a power of two."""
    return max(16, triton.next_power_of_2(head_dim))


def config_problem(config) -> str | None:
    """What is structurally wrong with a forward `config` (keys, values), or None."""
    if not isinstance(config, dict):
        return f"config must be a dict with keys {sorted(CONFIG_SPACE)}, not {type(config).__name__}"
    unknown = sorted(set(config) - set(CONFIG_SPACE), key=str)
    if unknown:
        return f"unknown key {unknown[0]!r} (keys: {sorted(CONFIG_SPACE)})"
    missing = sorted(set(CONFIG_SPACE) - set(config))
    if missing:
        return f"missing key {missing[0]!r} (a configuration names all of {sorted(CONFIG_SPACE)})"
    for axis, choices in CONFIG_SPACE.items():
        value = config[axis]
        if isinstance(value, bool) or value not in choices:
            return f"{axis}={value!r} is outside {choices}"
    return None


def config_invalid(config: dict, head_dim: int, *, dtype: torch.dtype | None = None) -> str | None:
    """Why the forward `config` cannot run `head_dim` on sm_90, or None when it can.

    Checks the keys and values against CONFIG_SPACE, then two conservative resource estimates.
    `dtype` is the input dtype; None assumes the widest (fp32), so a configuration valid for
    None is valid for every dtype (what a fuzzer drawing configurations before dtypes needs).
    """
    problem = config_problem(config)
    if problem:
        return problem
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        return f"head_dim={head_dim} is outside 1..{MAX_HEAD_DIM}"
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    warps, stages = config["num_warps"], config["num_stages"]
    padded = block_d(head_dim)
    elem = 4 if dtype is None else torch.empty((), dtype=dtype).element_size()
    # Shared memory: tl.dot reads its operands from shared memory, so Q (BLOCK_M x BLOCK_D) is
    # staged once, K and V tiles (BLOCK_N x BLOCK_D each) once per pipeline stage, and P
    # (BLOCK_M x BLOCK_N) is converted through it for the second dot. Triton reuses some of
    # these buffers; counting all of them over-estimates, which is the safe side: a launch over
    # the limit fails with OutOfResources.
    smem = elem * (block_m * padded + stages * 2 * block_n * padded + block_m * block_n)
    if smem > SMEM_LIMIT_BYTES:
        return (f"needs ~{smem // 1024} KiB of shared memory (Q + {stages} stage(s) of K and V + P "
                f"at BLOCK_D={padded}, {elem}-byte elements) > {SMEM_LIMIT_BYTES // 1024} KiB")
    # Registers: each thread holds its share of the fp32 accumulator (BLOCK_M x BLOCK_D), of the
    # scores and probabilities (2 x BLOCK_M x BLOCK_N) and of Q as a dot operand. Past ~192 fp32
    # values per thread (of 255 registers, the rest go to pointers and indices) ptxas spills the
    # tiles to local memory: compiles take minutes and the kernel is useless, so refuse it.
    per_thread = (block_m * padded + 2 * block_m * block_n
                  + block_m * padded * elem // 4) // (32 * warps)
    if per_thread > REGISTER_BUDGET:
        return (f"needs ~{per_thread} fp32 registers per thread with {warps} warp(s) "
                f"(BLOCK_M={block_m}, BLOCK_N={block_n}, BLOCK_D={padded}) > {REGISTER_BUDGET}")
    return None


# -- the forward's autotuner -----------------------------------------------------------------------
def _prune_invalid(configs, named_args, **meta):
    """The autotuner's early prune: keep the configurations that fit this head dim and dtype."""
    head_dim, dtype = named_args["HEAD_DIM"], named_args["Q"].dtype
    return [c for c in configs
            if config_invalid(autotune.config_dict(c), head_dim, dtype=dtype) is None]


_AUTOTUNERS: dict = {}


def autotuned(kernel):
    """`kernel` (fa2_fwd_kernel or a mutant of it) wrapped in @triton.autotune over AUTOTUNE_CONFIGS.

    Built once per kernel and kept: the autotuner's cache of winners lives on this object.
    Tuned per (Nq, Nk, BLOCK_D, upper edge, left edge, softcap, dtype): a window changes which
    tiles pay off. Compiled binaries are shared across keys.
    """
    tuner = _AUTOTUNERS.get(kernel)
    if tuner is None:
        configs = [triton.Config({"BLOCK_M": c["BLOCK_M"], "BLOCK_N": c["BLOCK_N"]},
                                 num_warps=c["num_warps"], num_stages=c["num_stages"])
                   for c in AUTOTUNE_CONFIGS]
        tuner = triton.autotune(configs=configs,
                                key=["N_QUERIES", "N_KEYS", "BLOCK_D", "IS_CAUSAL", "HAS_LEFT", "SOFTCAP"],
                                prune_configs_by={"early_config_prune": _prune_invalid})(kernel)
        _AUTOTUNERS[kernel] = tuner
    return tuner


# -- the backward ----------------------------------------------------------------------------------
BACKWARD_CONFIG_SPACE = {
    "BLOCK_M": (16, 32, 64, 128),    # query rows per tile
    "BLOCK_N": (16, 32, 64, 128),    # key rows per tile
    "num_warps": (4, 1, 2, 8),
    "num_stages": (1, 2, 3),         # software-pipelining depth of the inner loops (compiled)
}


def backward_config_invalid(config: dict, head_dim: int, *, element_size: int = 4) -> str | None:
    """Why the backward `config` would not fit on sm_90 for this head dim, or None if it should.

    Missing keys take their first choice. The check is a conservative shared-memory estimate of
    the larger of the two main kernels (compiled; the interpreter has no limit). Triton stages
    in shared memory every operand of a tensor-core dot that is not already in registers, and
    with num_stages > 1 it multi-buffers the tiles the inner loop loads. For the dK/dV kernel
    (the dQ kernel is the same with M and N swapped):

      * the streamed Q and dO tiles, BLOCK_M x BLOCK_D each, times num_stages buffers;
      * the resident K and V tiles, BLOCK_N x BLOCK_D each (loaded once, reused every step);
      * P^T and dS^T, BLOCK_N x BLOCK_M each, re-staged as the A operand of dV += P^T dO and
        dK += dS^T Q.

    Everything is counted at `element_size` bytes, 4 by default (fp32 inputs, whose TF32 dot
    operands are 4 bytes): the estimate then holds for every supported dtype; pass 2 for
    bf16/fp16. It ignores buffer reuse Triton may find, so it over-estimates (a rejected config
    might in fact fit); it does not count layout-conversion scratch, which is reused between
    conversions and smaller than the tiles counted. It is a first filter, not a guarantee.
    """
    unknown = sorted(set(config) - set(BACKWARD_CONFIG_SPACE))
    if unknown:
        return f"unknown config keys {unknown} (known: {sorted(BACKWARD_CONFIG_SPACE)})"
    full = {key: config.get(key, choices[0]) for key, choices in BACKWARD_CONFIG_SPACE.items()}
    for key, value in full.items():
        if value not in BACKWARD_CONFIG_SPACE[key]:
            return f"{key}={value!r} is not one of {BACKWARD_CONFIG_SPACE[key]}"
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        return f"head_dim={head_dim} is outside 1..{MAX_HEAD_DIM}"
    padded = block_d(head_dim)
    m, n, stages = full["BLOCK_M"], full["BLOCK_N"], full["num_stages"]

    def kernel_bytes(streamed, resident):
        return element_size * (stages * 2 * streamed * padded + 2 * resident * padded + 2 * m * n)

    need = max(kernel_bytes(m, n), kernel_bytes(n, m))   # dK/dV kernel, dQ kernel
    if need > SMEM_LIMIT_BYTES:
        return (f"needs ~{need // 1024} KiB shared memory (BLOCK_M={m}, BLOCK_N={n}, "
                f"BLOCK_D={padded}, num_stages={stages}, {element_size}-byte elements); "
                f"an sm_90 (Hopper) block gets at most {SMEM_LIMIT_BYTES // 1024} KiB")
    return None


# -- what a fuzzed case draws: the forward's axes, and the backward's as "bwd_" keys -------------
# Interpreted: tiles of 16 to 64 rows only, which keeps the interpreter's cost down. The first
# choices, what Hypothesis starts from and shrinks toward, are unequal (32 x 16), and
# BLOCK_M > BLOCK_N is drawn in half the cases: a loop bound using BLOCK_N where BLOCK_M belongs
# shows only then, on causal cases longer than 16. Warps and stages, which the interpreter
# ignores, have one choice there, so a file written on either machine names the same four keys
# and replays on the other. Compiled: the tiles, warps and stages of the real space, filtered by
# the shared-memory estimate.
# Interpreted choices set by `fuzzattn mutants --only mutant_bwd_dq_skips_key_block --profile ci`.
if is_interpreted():
    BACKWARD_CONFIGS = (("bwd_BLOCK_M", (32, 64, 16)), ("bwd_BLOCK_N", (16, 32)),
                        ("bwd_num_warps", (4,)), ("bwd_num_stages", (1,)))
else:
    BACKWARD_CONFIGS = (("bwd_BLOCK_M", (64, 32, 16, 128)), ("bwd_BLOCK_N", (64, 32, 16, 128)),
                        ("bwd_num_warps", (4, 8)), ("bwd_num_stages", (2, 1, 3)))


# -- the backward's defaults ---------------------------------------------------------------------
# Preference order for config=None when compiled: the first one backward_config_invalid takes
# for the head dim and element size is used. 64x64 / 4 warps / 2 stages is FA2's usual middle ground.
_COMPILED_DEFAULTS = (
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1},
    {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
    {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
)
# The interpreter pays per op, not per byte: the smallest tiles keep tests fast there.
_INTERPRETED_DEFAULT = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}


def default_backward_config(head_dim: int, element_size: int = 4) -> dict:
    """The config used for config=None: 16x16 interpreted, else the first compiled default that
    backward_config_invalid accepts for this head dim and element size."""
    if is_interpreted():
        return dict(_INTERPRETED_DEFAULT)
    for config in _COMPILED_DEFAULTS:
        if backward_config_invalid(config, head_dim, element_size=element_size) is None:
            return dict(config)
    return dict(_COMPILED_DEFAULTS[-1])


def resolve_backward_config(config, head_dim: int, element_size: int) -> dict:
    """config=None -> the default; a dict -> every key known, every value in the space, missing
    keys filled from the default; compiled, it must also pass backward_config_invalid."""
    resolved = default_backward_config(head_dim, element_size)
    if config is None:
        return resolved
    if not isinstance(config, dict):
        refuse("config", config, f"None or a dict with keys from {sorted(BACKWARD_CONFIG_SPACE)}")
    for key, value in config.items():
        if key not in BACKWARD_CONFIG_SPACE:
            refuse("config key", key, sorted(BACKWARD_CONFIG_SPACE))
        if isinstance(value, bool) or value not in BACKWARD_CONFIG_SPACE[key]:
            refuse(f"config[{key!r}]", value, BACKWARD_CONFIG_SPACE[key])
    resolved.update(config)
    if not is_interpreted():
        why = backward_config_invalid(resolved, head_dim, element_size=element_size)
        if why is not None:
            refuse("config", config, f"a config that fits an sm_90 (Hopper) block: {why}")
    return resolved


def backward_config_rule(config: dict, case) -> str | None:
    """Why the drawn backward tiles cannot run this case (compiled: shared memory), or None."""
    prefix = len("bwd_")
    backward = {name[prefix:]: value for name, value in config.items() if name.startswith("bwd_")}
    if not backward or is_interpreted():
        return None
    return backward_config_invalid(backward, case.head_dim,
                                   element_size=2 if case.dtype in ("bfloat16", "float16") else 4)


def forward_and_backward_rule(config: dict, case) -> str | None:
    """The forward's tiles (keys without a prefix) and the backward's (bwd_ keys), each by its
    own resource estimate."""
    forward = {name: value for name, value in config.items() if not name.startswith("bwd_")}
    if forward:
        why = config_invalid(forward, case.head_dim)
        if why:
            return why
    return backward_config_rule(config, case)


# -- a configuration the compiler gets wrong --------------------------------------------------------
def _faulting_fp32_tile(case) -> bool:
    """fp32 with the forward tile BLOCK_M=16 x BLOCK_N=128, 4 warps, no pipelining: measured on
    a GPU (triton 3.6.0) to fault with an illegal memory access at BLOCK_D=64, on a one-block
    case (Nq=16, Nk=128) as on a long ragged one. The same tile in fp16, with 2 stages, 8 warps,
    BLOCK_M=32 or BLOCK_N=64 runs correctly, and the interpreter's bounds guards see no
    out-of-bounds address in the kernel: the fault is in the compiled code for this point. Only
    the head dims measured are covered. Not in AUTOTUNE_CONFIGS, so the autotuned path never
    runs it; a pinned configuration does."""
    config = dict(case.config or ())
    return (case.dtype == "float32" and block_d(case.head_dim) == 64
            and (config.get("BLOCK_M"), config.get("BLOCK_N"), config.get("num_warps"),
                 config.get("num_stages")) == (16, 128, 4, 1))


KNOWN_DEFECTS = (
    KnownDefect("compiled forward faults (illegal memory access): fp32, BLOCK_M=16, BLOCK_N=128, "
                "4 warps, 1 stage, BLOCK_D=64 (triton 3.6.0)", "cuda",
                _faulting_fp32_tile, "a739a4c48449.json", check="device_fault"),
)
