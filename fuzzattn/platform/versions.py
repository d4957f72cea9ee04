"""The versions a judged case ran with: recorded in every counterexample file and report header."""
from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version


def _installed(name: str) -> str:
    try:
        return version(name)        # without importing: importing triton fixes its backend
    except PackageNotFoundError:
        return "not installed"


@functools.lru_cache(maxsize=None)
def _cached() -> tuple[tuple[str, str], ...]:
    import torch
    return (("torch", torch.__version__), ("triton", _installed("triton")),
            ("hypothesis", _installed("hypothesis")), ("fuzzattn", _installed("fuzzattn")))


def versions() -> dict[str, str]:
    """torch, triton, hypothesis and fuzzattn versions (a fresh dict each call)."""
    return dict(_cached())
