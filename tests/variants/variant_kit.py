"""What the tests of each declared variant (window and softcap, ALiBi, paged KV caches, packed
ragged batches) share: a small case and its float64 tensors, a kernel that records the call the
contract makes, the shipped regression files of a mutant, the small campaign that must kill
each mutant, and a textbook autograd check of the gradient oracle."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from fuzzattn import AttentionCase
from fuzzattn.campaigns.campaign import fuzz
from fuzzattn.campaigns.regression_file import RegressionFile, load
from fuzzattn.campaigns.file_replay import replay_one
from fuzzattn.contract import Implementation, profiles
from fuzzattn.gradients.reference_gradients import oracle_gradients
from fuzzattn.inputs.materialize import materialize
from fuzzattn.run.registry import mutants
from fuzzattn.strategies.cases import attention_cases

REGRESSIONS = Path(__file__).resolve().parents[2] / "regressions"


def case(seq_q: int, seq_k: int, **fields) -> AttentionCase:
    """One sequence, one head, D = 4: small enough to check the oracle by hand."""
    return AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=seq_q, seq_k=seq_k, head_dim=4,
                         **fields)


def tensors(c: AttentionCase) -> list[torch.Tensor]:
    """q, k, v of a case in float64, as the oracle computes."""
    return [t.double() for t in materialize(c).tensors()]


def assert_gradient_oracle_is_autograd(c: AttentionCase, seen: torch.Tensor, *, bias=None,
                                       dout_seed: int = 1) -> None:
    """The gradient oracle's dq, dk, dv for `c` (one query head group, a softcap) against
    autograd of the forward written out from the definitions: the scaled scores capped, then
    `bias` ((Hq, Nq, Nk), or None) added, keys outside `seen` ((Nq, Nk) bool) hidden."""
    q, k, v = tensors(c)
    dout = torch.randn(q.shape, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(dout_seed))
    got = oracle_gradients(q, k, v, dout, c).grads
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    lq, lk, lv = leaves
    group = c.heads // c.kv_heads
    lk, lv = lk.repeat_interleave(group, dim=1), lv.repeat_interleave(group, dim=1)
    cap = c.softcap
    s = cap * torch.tanh(c.softmax_scale * (lq @ lk.transpose(-1, -2)) / cap)
    if bias is not None:
        s = s + bias
    out = torch.softmax(s.masked_fill(~seen, -math.inf), dim=-1) @ lv
    want = torch.autograd.grad(out, leaves, dout)
    for name, expected in zip(("dq", "dk", "dv"), want):
        assert torch.allclose(got[name], expected, rtol=1e-10, atol=1e-12), name


@dataclass
class Call:
    """One call as the kernel received it: after the contract's packing or paging."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kwargs: dict


class RecordingKernel:
    """A kernel that records each call the contract makes (the tensors as handed over, and every
    keyword), then answers with `forward`, or with zeros where the answer does not matter."""

    def __init__(self, forward: Callable | None = None):
        self.forward = forward
        self.calls: list[Call] = []

    def __call__(self, q, k, v, **kwargs):
        self.calls.append(Call(q, k, v, dict(kwargs)))
        return self.forward(q, k, v, **kwargs) if self.forward else torch.zeros_like(q)


def shipped(impl_name: str) -> list[RegressionFile]:
    """The regression files shipped in regressions/ that were recorded against `impl_name`."""
    return [load(p) for p in sorted(REGRESSIONS.glob("*.json"))
            if json.loads(p.read_text()).get("impl") == impl_name]


def assert_catches_only_the_mutant(fixture: RegressionFile, mutant_name: str,
                                   kernel: Implementation) -> None:
    """A shipped file is worth keeping when its replay fails the mutant and passes the kernel the
    mutant was made from."""
    assert not replay_one(fixture, mutants()[mutant_name]).passed, (mutant_name, fixture.path)
    assert replay_one(fixture, kernel).passed, (kernel.name, fixture.path)


def killing_case(mutant_name: str) -> AttentionCase:
    """The failing case a small campaign (60 float32 cases of the ci profile's draws) finds
    against a mutant; the test fails, naming the mutant, if it survives."""
    mutant = mutants()[mutant_name]
    drawn = attention_cases(mutant.caps, dtype="float32", profile=profiles.PROFILES["ci"])
    result = fuzz(mutant, drawn, max_examples=60, save_to_file=False)
    assert result.counterexample is not None, f"{mutant_name} survived {result.cases} cases"
    return result.counterexample.judged.case
