"""Where implementations are found: the registered kernels, the mutant zoo, and outside files."""
from __future__ import annotations

from .contract import Implementation


class UnknownImplementationError(LookupError):
    """A name that matches no registered implementation or mutant."""


def implementations() -> dict[str, Implementation]:
    """The real implementations, by name (importing kernels selects the Triton backend)."""
    import kernels
    return {impl.name: impl for impl in kernels.IMPLEMENTATIONS}


def mutants() -> dict[str, Implementation]:
    """Seeded-bug variants: fuzzed to be caught, never expected to pass."""
    import kernels.mutants
    return {impl.name: impl for impl in kernels.mutants.MUTANTS}


def get(name: str) -> Implementation:
    """A registered implementation or mutant by name."""
    known = {**implementations(), **mutants()}
    if name in known:
        return known[name]
    raise UnknownImplementationError(
        f"unknown implementation {name!r}; registered: {', '.join(sorted(implementations()))}"
        f"; mutants: {len(mutants())} (fuzzattn mutants --list)")
