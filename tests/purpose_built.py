"""Purpose-built implementations for the expected-failure and `explain` tests: each is exact (a
float64 softmax on the rounded inputs) except for one planted dependence on one factor, so a
test knows which factor a triage must name. Loaded as `tests/purpose_built.py:NAME`."""
import math
import textwrap

import torch

from fuzzattn.contract import Capabilities, Implementation

ALL_DTYPES = {"float32", "bfloat16", "float16"}
CAPS = Capabilities(dtypes=ALL_DTYPES, head_dims=None, causal=("top_left", "bottom_right"),
                    gqa=True)


def _attention(q, k, v, *, causal, scale, offset_override=None, no_max=False):
    causal, scale = CAPS.check_inputs(q, k, v, causal=causal, scale=scale)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    n, m = s.shape[-2:]
    if causal != "none":
        offset = m - n if causal == "bottom_right" else 0
        if offset_override is not None:
            offset = offset_override(n, m, causal)
        visible = torch.arange(m)[None, :] - torch.arange(n)[:, None] <= offset
        s = s.masked_fill(~visible.to(s.device), -math.inf)
    if no_max:
        # the planted bug: exp without subtracting the row max, in fp32 (overflows past ~88)
        p = torch.exp(s.float())
        out = (p @ v.float()) / p.sum(-1, keepdim=True)
        lse = torch.log(p.sum(-1))
    else:
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)     # rows with no visible key: 0
        out = p @ v.double()
    return out.to(q.dtype), lse.float()


def exact(q, k, v, *, causal, scale):
    return _attention(q, k, v, causal=causal, scale=scale)


def bottom_right_as_top_left(q, k, v, *, causal, scale):
    """Wrong only for bottom-right causal with Nq != Nk: the diagonal offset is dropped."""
    return _attention(q, k, v, causal=causal, scale=scale, offset_override=lambda n, m, c: 0)


def no_running_max(q, k, v, *, causal, scale):
    """Wrong only when scores pass exp's fp32 range: values=large (and scale 1 makes it sure)."""
    return _attention(q, k, v, causal=causal, scale=scale, no_max=True)


def tiled(q, k, v, *, causal, scale, config):
    """Declares a tile size; the 7-wide tile forgets the keys past the last whole tile."""
    if config["tile"] == 7 and k.shape[2] > 7:
        k, v = k[:, :, :k.shape[2] // 7 * 7], v[:, :, :v.shape[2] // 7 * 7]
        if causal == "bottom_right":
            raise AssertionError("not used with bottom-right")
    return _attention(q, k, v, causal=causal, scale=scale)


def segfault_on_large(q, k, v, *, causal, scale):
    """Dies with SIGSEGV when q passes 8 (values=large; normal values stay under 6 sigma): a crash
    only a worker survives."""
    if q.abs().amax() > 8:
        import ctypes
        ctypes.string_at(0)
    return _attention(q, k, v, causal=causal, scale=scale)


EXACT = Implementation("exact", exact, CAPS, description="float64 softmax: passes everything")
SEGFAULT_ON_LARGE = Implementation("segfault_on_large", segfault_on_large, CAPS,
                                   description="SIGSEGV on values=large, exact otherwise")
BOTTOM_RIGHT_AS_TOP_LEFT = Implementation("bottom_right_as_top_left", bottom_right_as_top_left, CAPS,
                                          description="bottom-right computed as top-left")
NO_RUNNING_MAX = Implementation("no_running_max", no_running_max, CAPS,
                                description="fp32 exp without the row max")
TILED = Implementation("tiled", tiled,
                       Capabilities(dtypes=ALL_DTYPES, head_dims=None, causal=("top_left",),
                                    gqa=True, configs={"tile": (16, 7)}),
                       description="a tile of 7 drops the ragged key tail")


# The source of a kernel file kept outside the repository, for the CLI's tests that load
# FILE.py:NAME: attention that never looks at the last key, wrong whenever Nk > 1.
DROP_LAST_KEY_SOURCE = textwrap.dedent('''
    """Attention that never looks at the last key: wrong whenever Nk > 1."""
    import math
    import torch

    def drop_last_key(q, k, v, *, causal, scale):
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        n, m = s.shape[-2:]
        if causal:
            s = s.masked_fill(~torch.ones(n, m, dtype=torch.bool, device=s.device).tril(), -math.inf)
        if m > 1:
            s[..., -1] = -math.inf
        return (torch.softmax(s, -1) @ v.float()).to(q.dtype), torch.logsumexp(s, -1)

    NOT_CALLABLE = 42
''')
