"""Seeded-bug variants of the kernels (filled in later)."""

MUTANTS = ()
