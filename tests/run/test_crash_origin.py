"""Crashes are told apart by where in the kernel's own code they strike (run/execute.py:
crash_origin), as crash triagers group them: two plain crashes of one exception type raised from
two functions are two causes; a library frame below the kernel's does not name the crash."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from fuzzattn import Capabilities, Implementation
from fuzzattn.campaigns.campaign import fuzz, judge_once
from fuzzattn.contract.case import AttentionCase

CAPS = Capabilities(dtypes={"float32"}, head_dims={8, 16}, causal=())


def _narrow_tiles(q):
    raise ValueError("tile plan failed")        # one bug: the D=8 path


def _wide_tiles(q):
    return torch.zeros(2).view(3)                # another: the D=16 path, raised inside torch


def _attention(q, k, v, *, causal, scale):
    (_narrow_tiles if q.shape[-1] == 8 else _wide_tiles)(q)
    return q, None


TWO_CRASHES = Implementation("two_crashes", _attention, CAPS)


def test_a_crash_names_the_innermost_frame_in_the_kernels_own_file():
    narrow = judge_once(TWO_CRASHES, AttentionCase(1, 1, 1, 2, 2, 8)).first_failure
    wide = judge_once(TWO_CRASHES, AttentionCase(1, 1, 1, 2, 2, 16)).first_failure
    assert narrow.check == wide.check == "crash"
    assert narrow.origin == "test_crash_origin.py:_narrow_tiles"
    assert wide.origin == "test_crash_origin.py:_wide_tiles"       # torch's frames below it
    assert "(raised in test_crash_origin.py:_narrow_tiles)" in narrow.headline()


def test_two_plain_crashes_from_two_functions_are_two_causes():
    cases = st.builds(AttentionCase, batch=st.just(1), heads=st.just(1), kv_heads=st.just(1),
                      seq_q=st.integers(1, 4), seq_k=st.integers(1, 4),
                      head_dim=st.sampled_from([8, 16]))
    found = fuzz(TWO_CRASHES, cases, max_examples=60, stop_at_first=False, save_to_file=False,
                 hypothesis_seed_value=0)
    signatures = sorted(d.signature for d in found.defects)
    assert signatures == [
        "fails plainly: crash: RuntimeError in test_crash_origin.py:_wide_tiles",
        "fails plainly: crash: ValueError in test_crash_origin.py:_narrow_tiles"], signatures
