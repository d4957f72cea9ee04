"""Where implementations are found: a registry that packages fill through entry points.

The engine never imports a kernel package. A package offers implementations by naming a
sequence of `Implementation` objects in an entry point group of its pyproject.toml:

    [project.entry-points."fuzzattn.implementations"]
    my_kernels = "my_package.attention:IMPLEMENTATIONS"
    [project.entry-points."fuzzattn.mutants"]          # seeded-bug variants, fuzzed to be caught
    my_mutants = "my_package.attention_mutants:MUTANTS"

This repository's own `kernels/` registers itself the same way, so a user's package and ours are
found alike. Implementations outside any package are named with `--impl path/file.py:NAME`
(fuzzattn.run.loader).
"""
from __future__ import annotations

import functools
from importlib.metadata import entry_points

from fuzzattn.contract.implementation import Implementation

IMPLEMENTATIONS_GROUP = "fuzzattn.implementations"
MUTANTS_GROUP = "fuzzattn.mutants"


class UnknownImplementationError(LookupError):
    """A name that matches no registered implementation or mutant."""


class RegistryError(RuntimeError):
    """An entry point that does not load or does not name Implementations."""


@functools.lru_cache(maxsize=None)
def _load_group(group: str) -> tuple[Implementation, ...]:
    found: list[Implementation] = []
    for entry in sorted(entry_points(group=group), key=lambda e: e.name):
        try:
            loaded = entry.load()
        except Exception as exc:
            raise RegistryError(f"entry point {group}:{entry.name} ({entry.value}) failed to load: "
                                f"{type(exc).__name__}: {exc}") from None
        items = tuple(loaded) if isinstance(loaded, (list, tuple)) else (loaded,)
        for item in items:
            if not isinstance(item, Implementation):
                raise RegistryError(f"entry point {group}:{entry.name} ({entry.value}) holds a "
                                    f"{type(item).__name__}, not an Implementation")
        found.extend(items)
    return tuple(found)


def implementations() -> dict[str, Implementation]:
    """The real implementations, by name."""
    return {impl.name: impl for impl in _load_group(IMPLEMENTATIONS_GROUP)}


def mutants() -> dict[str, Implementation]:
    """Seeded-bug variants: fuzzed to be caught, never expected to pass."""
    return {impl.name: impl for impl in _load_group(MUTANTS_GROUP)}


def get(name: str) -> Implementation:
    """A registered implementation or mutant by name."""
    known = {**implementations(), **mutants()}
    if name in known:
        return known[name]
    raise UnknownImplementationError(
        f"unknown implementation {name!r}; registered: {', '.join(sorted(implementations()))}"
        f"; mutants: {len(mutants())} (fuzzattn mutants --list)")
