"""A small third-party PyTorch attention kernel with two independent bugs, each of which shows
under more than one check: the example of how fuzzattn reports defects by cause, not by check.

    fuzzattn fuzz --impl examples/two_bug_attention.py:TWO_BUGS

Seeded bugs, on purpose:

1. V is read through K's strides. It builds V's view from K's `stride()`, as a kernel that
   computes one set of pointer offsets for both does. Whenever K and V share a layout that is the
   same thing; when they do not, V's elements come from the wrong places (wrong values) or from
   past V's storage (`as_strided` raises: a crash). One cause, two symptoms: cured by giving V
   the layout K has.
2. The last key is dropped when Nk is odd: the key loop walks pairs of keys and forgets the odd
   one out. Cured by an even Nk; with Nk = 1 no key is left, and every output row is NaN.

fuzzattn reports exactly two defects for it, each once, with one regression file each
(tests/user_facing/test_two_bug_example.py pins that, with one and with two workers).
"""
import fuzzattn  # noqa: F401

import torch

from fuzzattn import Capabilities, Implementation, refuse


def _attention(q, k, v, *, causal, scale):
    if causal:
        refuse("causal", causal, "non-causal only")
    # BUG 1 (seeded): V's view takes K's strides and storage offset, not its own.
    v = v.as_strided(v.shape, k.stride(), k.storage_offset())
    n = k.shape[-2] - k.shape[-2] % 2          # BUG 2 (seeded): pairs of keys; an odd last one lost
    k, v = k[..., :n, :], v[..., :n, :]
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ v.float()
    return out.to(q.dtype), lse


TWO_BUGS = Implementation(
    "two_bugs", _attention,
    Capabilities(dtypes=frozenset({"float32"}), head_dims=frozenset({8, 16}), causal=()))
