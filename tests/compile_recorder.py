"""A purpose-built stand-in for a kernel that compiles per variant (tests/test_palette.py).

It computes correct attention with plain torch and records, per call, the variant a compiled
kernel would build for it (the head dim's class and the configuration's tile) and the process
that asked, one line appended to the file FUZZATTN_TEST_COMPILE_RECORD names. Declared a Triton
kernel, so its campaigns draw from compile palettes. BUGGY gets head dim 64 wrong.
"""
from __future__ import annotations

import os

import torch

from fuzzattn import Capabilities, Implementation
from fuzzattn.strategies.palette import dim_class

RECORD_ENV = "FUZZATTN_TEST_COMPILE_RECORD"
CAPS = Capabilities(dtypes={"float32"}, head_dims={16, 32, 64}, causal=(), strides="contiguous",
                    configs={"BLOCK": (16, 32, 64, 128)}, default_config={"BLOCK": 16})


def variant(q: torch.Tensor, config: dict) -> str:
    return f"D{dim_class(q.shape[-1])}/BLOCK{config['BLOCK']}"


def _attention(q, k, v, *, causal, scale, config):
    path = os.environ.get(RECORD_ENV)
    if path:
        with open(path, "a") as f:          # one short append: whole lines from both processes
            f.write(f"{os.getpid()} {variant(q, config)}\n")
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    return (torch.softmax(s, -1) @ v.double()).to(q.dtype), torch.logsumexp(s, -1).float()


def _buggy(q, k, v, *, causal, scale, config):
    out, lse = _attention(q, k, v, causal=causal, scale=scale, config=config)
    return (out * 2 if q.shape[-1] == 64 else out), lse


RECORDER = Implementation("compile_recorder", _attention, CAPS, backend="triton")
BUGGY = Implementation("compile_recorder_buggy", _buggy, CAPS, backend="triton")
