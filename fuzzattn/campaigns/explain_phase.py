"""Keep fuzzattn's own lines out of Hypothesis's explain phase.

After shrinking a failure, Hypothesis traces the test again and reports the lines "always and
only run by failing test cases". In a test that calls `check_case`, the lines that describe,
save and raise a failure are such lines in every failure: reported, they point the reader at
the harness instead of at the kernel. Hypothesis leaves its own files out of that trace with
one predicate, `hypothesis.internal.scrutineer.should_trace_file(filename)`; there is no public
way to name another library's files, so `install` wraps that predicate to leave fuzzattn's
package out too (which also spares the trace the judge's many lines).

It is an internal function, so the wrap applies only inside TESTED and only when the function
is there with one parameter; elsewhere Hypothesis runs as shipped, and a failure's explanation
may list fuzzattn's lines: noisier, never wrong.
"""
from __future__ import annotations

import functools
import inspect
import os
from pathlib import Path

from fuzzattn.triton_interpreter.fence import release

# Read against hypothesis 6.170's scrutineer; the predicate has kept its shape within 6.x since.
TESTED = ((6, 170), (7,))
_PACKAGE = str(Path(__file__).resolve().parent.parent) + os.sep
_MARK = "_fuzzattn_untraced"


def applies(version: str) -> bool:
    """Whether a Hypothesis of this version gets the wrap (TESTED's lower bound included)."""
    have = release(version)
    low, high = TESTED
    return bool(have) and low <= have[:len(low)] and have[:len(high)] < high


def ours(filename: str) -> bool:
    """A file of the fuzzattn package itself (not the kernels or strategies it judges with)."""
    try:
        return str(Path(filename).resolve()).startswith(_PACKAGE)
    except (OSError, ValueError):
        return False


def install() -> bool:
    """Wrap Hypothesis's trace predicate (idempotent); returns whether the wrap is in place."""
    import hypothesis
    try:
        from hypothesis.internal import scrutineer
    except ImportError:
        return False
    original = getattr(scrutineer, "should_trace_file", None)
    if getattr(original, _MARK, False):
        return True
    if not applies(hypothesis.__version__) or not callable(original) or not _one_parameter(original):
        return False

    @functools.cache
    def should_trace_file(filename: str) -> bool:
        return original(filename) and not ours(filename)

    setattr(should_trace_file, _MARK, True)
    scrutineer.should_trace_file = should_trace_file
    return True


def _one_parameter(function) -> bool:
    try:
        return len(inspect.signature(function).parameters) == 1
    except (TypeError, ValueError):
        return False
