"""Derive a mutant function from a real kernel's source by one textual edit.

A mutant here is never a hand-maintained copy: it is the real function's current source with one
`(old, new)` replacement applied (a few replacements at most, when one bug spans two lines), then
compiled and executed in a copy of the real module's globals. So

* a mutant differs from the real kernel by exactly the planted bug, and stays in step with it
  when the real kernel changes;
* an edit whose `old` text no longer occurs exactly once stops the import with a message naming
  the mutant, instead of silently planting nothing (a mutant identical to the real kernel would
  "survive" and look like a gap in the fuzzer).

A kernel that calls `@triton.jit` helpers is mutated with `mutate(kernel, edits, helpers=...)`:
each edit applies to whichever of the kernel and its helpers holds its text (exactly once among
all of them), and the kernel is recompiled so that it calls the mutated helper by name.

The mutated source is registered with `linecache` under a descriptive file name, so tracebacks
show the mutated lines and `@triton.jit` (which re-reads a kernel's source with `inspect`, both
compiled and in the interpreter) works on it like on any kernel defined in a file.
"""
from __future__ import annotations

import inspect
import linecache
import sys
import textwrap
from typing import Callable, Sequence


class EditError(RuntimeError):
    """An edit that does not apply: its text is missing from, or repeated in, the source."""


def apply_edits(source: str, edits: Sequence[tuple[str, str]], name: str) -> str:
    """`source` with each (old, new) applied; each `old` must occur exactly once."""
    for old, new in edits:
        count = source.count(old)
        if count != 1:
            raise EditError(f"{name}: the edit target {old!r} occurs {count} times in the real "
                            f"source (expected exactly once); update the mutant")
        source = source.replace(old, new)
    return source


def mutate(real: Callable, edits: Sequence[tuple[str, str]], *, name: str,
           extra_globals: dict | None = None, helpers: Sequence[Callable] = ()):
    """A new function (or `@triton.jit` kernel) compiled from `real`'s source after `edits`.

    `real` may be a plain function or a Triton JITFunction (its `.fn` holds the Python source).
    `extra_globals` adds names the edited source refers to (helpers defined by the mutant).
    `helpers`: functions `real` calls by their global name whose source the edits may target;
    a mutated helper is compiled the same way and bound, under its name, in `real`'s copy.
    """
    functions = [real, *helpers]
    sources = [textwrap.dedent(inspect.getsource(getattr(f, "fn", f))) for f in functions]
    edited = [False] * len(functions)
    for old, new in edits:
        counts = [source.count(old) for source in sources]
        if sum(counts) != 1:
            where = "the real source" if not helpers else "the real kernel and its helpers"
            raise EditError(f"{name}: the edit target {old!r} occurs {sum(counts)} times in {where} "
                            f"(expected exactly once); update the mutant")
        holder = counts.index(1)
        sources[holder] = sources[holder].replace(old, new)
        edited[holder] = True
    bound = dict(extra_globals or {})
    for helper, source, changed in zip(helpers, sources[1:], edited[1:]):
        if changed:
            python_fn = getattr(helper, "fn", helper)
            bound[python_fn.__name__] = _compile(python_fn, source, name, {})
    return _compile(getattr(real, "fn", real), sources[0], name, bound)


def _compile(python_fn: Callable, source: str, name: str, extra_globals: dict):
    """Execute `source` (python_fn's, edited) in a copy of its module's globals; return it."""
    module = sys.modules[python_fn.__module__]
    filename = f"<{name}: {python_fn.__module__}.{python_fn.__name__} with a planted bug>"
    # (size, mtime, lines, fullname) with mtime None: linecache.checkcache never evicts it.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = dict(vars(module))
    namespace.update(extra_globals)
    exec(compile(source, filename, "exec"), namespace)
    return namespace[python_fn.__name__]
