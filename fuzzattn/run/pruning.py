"""Triton's autotuner semantics for a declared configuration space: compile failures it skips.

Triton's autotuner benchmarks each configuration and treats three errors as an infinite time, so
production never runs a configuration that raises one of them for the arguments at hand
(triton/runtime/autotuner.py, `Autotuner._bench`):

    triton.runtime.errors.OutOfResources                 (shared memory, registers)
    triton.compiler.errors.CompileTimeAssertionFailure   (a failed tl.static_assert)
    triton.runtime.errors.PTXASError                     (ptxas rejected the kernel)

A case whose configuration fails with one of them is *pruned*, not a counterexample: the judge
reports it like a refusal (`PRUNED_PREFIX`), campaigns count it per configuration and draw
another case. Only when no configuration of the declared space compiles for the case is it a
finding, `no_configuration_compiles`: what the autotuner would meet in production. Any other
compile error (an internal compiler error, an MLIR pass failure) stays a crash. A declaration
opts out with `Capabilities(prune_compile_errors=False)`.

Triton's interpreter compiles nothing: a failed `tl.static_assert` there raises an
InterpreterError around an AssertionError from the interpreter's static_assert; it counts as the
CompileTimeAssertionFailure it is when compiled.

Whether a configuration compiles is assumed to depend on what its compile-time constants are
derived from: the configuration, the head dim, the dtype and the causal mode (`compile_key`).
Results are remembered per process under that key, so the whole space is tried at most once
per such combination.
"""
from __future__ import annotations

import itertools
import sys

from fuzzattn.contract.capabilities import BACKWARD_CONFIG_PREFIX
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.implementation import Implementation

PRUNED_PREFIX = "pruned, does not compile"     # how a pruned case's judgement reads (refused)
SKIPPED_BY_AUTOTUNER = ("OutOfResources", "CompileTimeAssertionFailure", "PTXASError")
NO_CONFIGURATION = "no_configuration_compiles"
_SPACE_LIMIT = 4096            # points of a forward space enumerated at most

# (impl cli name, compile_key) -> the autotuner-skipped summary, or "" when it compiled
_compiles: dict[tuple, str] = {}


def _triton_classes() -> tuple:
    if "triton" not in sys.modules:       # nothing compiled by Triton can have raised
        return ()
    try:
        from triton.compiler.errors import CompileTimeAssertionFailure
        from triton.runtime.errors import OutOfResources, PTXASError
    except ImportError:
        return ()
    return (OutOfResources, CompileTimeAssertionFailure, PTXASError)


def _interpreted_static_assert(exc: BaseException) -> AssertionError | None:
    """The AssertionError of a failed tl.static_assert run by Triton's interpreter, or None.
    Read from the traceback, so before the call's exception is detached from it."""
    cause = exc.__cause__
    if type(exc).__name__ != "InterpreterError" or not isinstance(cause, AssertionError):
        return None
    tb = cause.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return cause if tb is not None and tb.tb_frame.f_code.co_name == "_new_static_assert" else None


def autotuner_skips(exc: BaseException) -> str:
    """'TypeName: first line' when Triton's autotuner would skip a configuration raising `exc`
    (module docstring), else ''."""
    classes = _triton_classes()
    if classes and isinstance(exc, classes):
        kind = next(c.__name__ for c in classes if isinstance(exc, c))
        # a compiled CompilationError reads "at LINE:COL:", the source, then its message
        # (error_message); the interpreter's and the others' first line is their message
        message = getattr(exc, "error_message", None) or str(exc)
        lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
        return f"{kind}: {lines[0][:200]}" if lines else kind
    failed = _interpreted_static_assert(exc)
    if failed is not None:
        return f"CompileTimeAssertionFailure: {str(failed).strip()[:200] or 'static_assert failed'}"
    return ""


def forward_config(impl: Implementation, case: AttentionCase) -> dict:
    return impl.caps.pass_config(case, backward=False)


def prunes(impl: Implementation, case: AttentionCase) -> bool:
    """Whether a skipped compile error of this case's forward configuration prunes the case."""
    return bool(impl.caps.prune_compile_errors and dict(case.config)
                and any(not n.startswith(BACKWARD_CONFIG_PREFIX) for n, _ in case.config))


def compile_key(case: AttentionCase) -> tuple:
    """What a configuration's compiling is assumed to depend on (module docstring)."""
    forward = tuple((n, v) for n, v in case.config if not n.startswith(BACKWARD_CONFIG_PREFIX))
    return forward, case.head_dim, case.dtype, case.causal


def describe_key(key: tuple) -> str:
    """'D=32 float32' (+ ' causal=top_left'): the case class a pruned configuration fails for."""
    _, head_dim, dtype, causal = key
    return f"D={head_dim} {dtype}" + (f" causal={causal}" if causal != "none" else "")


def config_text(config) -> str:
    return " ".join(f"{name}={value}" for name, value in config)


def _space(impl: Implementation, case: AttentionCase):
    """Every forward configuration the declaration allows for this case, the case's own first."""
    axes = [(n, c) for n, c in impl.caps.configs if not n.startswith(BACKWARD_CONFIG_PREFIX)]
    backward = tuple((n, v) for n, v in case.config if n.startswith(BACKWARD_CONFIG_PREFIX))
    own = compile_key(case)[0]
    yield own
    for values in itertools.islice(itertools.product(*(c for _, c in axes)), _SPACE_LIMIT):
        config = tuple(sorted(zip((n for n, _ in axes), values)))
        if config != own and impl.caps.why_not_config(
                case.replace(config=tuple(sorted(config + backward)))) is None:
            yield config


def remember(impl: Implementation, case: AttentionCase, skipped: str) -> None:
    _compiles[(impl.cli_name, compile_key(case))] = skipped


def judge_pruned(impl: Implementation, case: AttentionCase, skipped: str, call):
    """The case's own configuration failed with `skipped` (an autotuner-skipped error): try the
    rest of the declared space on the same inputs until one compiles. Returns (the refusal text,
    None) when one does (the case is pruned), else (None, the detail of a
    no_configuration_compiles finding).
    A configuration 'compiles' when its call raises nothing the autotuner would skip.
    `call(case) -> execute.Call` runs the implementation on the inputs at hand."""
    remember(impl, case, skipped)
    failures = []
    for config in _space(impl, case):
        other = case.replace(config=tuple(sorted(
            config + tuple((n, v) for n, v in case.config if n.startswith(BACKWARD_CONFIG_PREFIX)))))
        key = (impl.cli_name, compile_key(other))
        if key not in _compiles:
            _compiles[key] = call(other).autotuner_skips
        if not _compiles[key]:
            return f"{PRUNED_PREFIX}: {skipped}", None
        failures.append((config, _compiles[key]))
    shown = "; ".join(f"{config_text(c)}: {why}" for c, why in failures[:4])
    more = f"; and {len(failures) - 4} more" if len(failures) > 4 else ""
    return (None, f"none of the {len(failures)} declared configurations compiles for "
                  f"{describe_key(compile_key(case))} ({shown}{more})")
