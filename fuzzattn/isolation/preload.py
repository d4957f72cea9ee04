"""Imported once by the fork server that isolated workers are forked from: torch, fuzzattn and
the Triton backend are imported, and one case judged on the CPU, before any fork.

A worker process then starts in tens of milliseconds instead of the seconds a spawned worker
takes to import torch and judge its first case, which is what makes a restart after every hang or death affordable while a campaign shrinks one. Nothing
here may touch CUDA: a process that initialised CUDA cannot be forked (on a GPU host the server
runs with torch's NVML-based CUDA checks, and a worker that cannot start makes the supervisor
spawn instead). A failure here only costs speed: the worker imports what it needs.
"""
from __future__ import annotations


def _warm() -> None:
    import torch
    import fuzzattn  # noqa: F401  -- selects the Triton backend before anything imports triton
    from fuzzattn.contract.case import AttentionCase
    from fuzzattn.isolation.worker import _warm_up_impl
    from fuzzattn.judgement.judge import judge
    from fuzzattn.triton_interpreter.backend import ensure_backend
    ensure_backend()
    before = torch.get_num_threads()
    torch.set_num_threads(1)       # no intra-op thread pool exists in the server when it forks
    try:
        judge(_warm_up_impl(), AttentionCase(1, 1, 1, 2, 2, 16), device="cpu")
    finally:
        torch.set_num_threads(before)


try:
    _warm()
except Exception:                  # noqa: BLE001 -- see the module docstring
    pass
