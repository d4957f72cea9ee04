"""triton_fa2_varlen: the Triton kernel on packed sequences, judged like every implementation
(under the interpreter here), its per-sequence mask edges, and its loading by `--impl`."""
from __future__ import annotations

import itertools

import pytest
import torch

from fuzzattn import AttentionCase
from fuzzattn.contract.capabilities import UnsupportedCaseError
from fuzzattn.judgement.judge import judge
from fuzzattn.kernels import triton_fa2_variants as variants
from fuzzattn.kernels.triton_fa2_varlen import IMPL, triton_fa2_varlen_forward
from fuzzattn.run.loader import load_implementation


def packed(seqlens_q, seqlens_k, **fields) -> AttentionCase:
    return AttentionCase(batch=1, heads=2, kv_heads=1, seq_q=sum(seqlens_q), seq_k=sum(seqlens_k),
                         head_dim=24, seqlens_q=tuple(seqlens_q), seqlens_k=tuple(seqlens_k),
                         **fields)


@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("window", [(-1, -1), (0, 0), (3, -1), (-1, 2), (5, 1)])
@pytest.mark.parametrize("lengths", [(3, 17), (17, 3), (0, 5), (9, 9)])
def test_per_sequence_edges_are_the_dense_edges_of_its_lengths(causal, window, lengths):
    """The kernel combines sequence_edges with each sequence's lengths as below; for one pair of
    lengths that must be mask_edges, the rule the dense kernel and the backward use."""
    seq_q, seq_k = lengths
    top, upper_diagonal, lower_diagonal = variants.sequence_edges(causal, window)
    diagonal = seq_k - seq_q
    uppers = [e for e in (top, None if upper_diagonal is None else diagonal + upper_diagonal)
              if e is not None]
    lower = None if lower_diagonal is None else diagonal + lower_diagonal
    assert (min(uppers) if uppers else None, lower) == variants.mask_edges(causal, window,
                                                                          seq_q, seq_k)


@pytest.mark.parametrize("c", [
    # ragged lengths across tiles of 16, an empty sequence each way, GQA, both alignments
    packed((17, 1, 0, 5), (3, 20, 4, 0), causal="bottom_right"),
    packed((9, 16), (16, 9), causal="top_left", window=(4, 1)),
    packed((18, 2), (18, 33), softcap=3.0, window=(-1, 0)),
], ids=["ragged-bottom-right", "window-top-left", "softcap-window"])
def test_packed_cases_pass_with_their_gradients(c):
    judged = judge(IMPL, c, "cpu")
    assert judged.passed, judged.first_failure


def test_a_sequence_without_keys_is_out_zero_and_lse_minus_inf():
    q = torch.randn(4, 2, 16)
    k = v = torch.randn(3, 1, 16)
    offsets = dict(cu_seqlens_q=torch.tensor([0, 2, 4], dtype=torch.int32),
                   cu_seqlens_k=torch.tensor([0, 3, 3], dtype=torch.int32),
                   max_seqlen_q=2, max_seqlen_k=3)
    out, lse = triton_fa2_varlen_forward(q, k, v, causal=False, scale=0.25, **offsets)
    assert torch.equal(out[2:], torch.zeros(2, 2, 16))
    assert torch.isinf(lse[:, 2:]).all() and (lse[:, 2:] < 0).all()
    assert torch.isfinite(out[:2]).all() and torch.isfinite(lse[:, :2]).all()


@pytest.mark.parametrize("bad, named", [
    (dict(cu_seqlens_k=torch.tensor([0, 2, 3], dtype=torch.int64)), "cu_seqlens_k"),
    (dict(max_seqlen_q=1), "max_seqlen_q"),
    (dict(cu_seqlens_q=torch.tensor([0, 3, 2], dtype=torch.int32)), "cu_seqlens_q"),
])
def test_a_bad_packing_is_refused_naming_it(bad, named):
    q, k = torch.randn(4, 1, 16), torch.randn(3, 1, 16)
    call = dict(cu_seqlens_q=torch.tensor([0, 2, 4], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, 2, 3], dtype=torch.int32),
                max_seqlen_q=2, max_seqlen_k=2)
    with pytest.raises(UnsupportedCaseError, match=named):
        triton_fa2_varlen_forward(q, k, k, causal=False, scale=1.0, **dict(call, **bad))


@pytest.mark.parametrize("spec", ["fuzzattn.kernels.triton_fa2_varlen:IMPL",
                                  "fuzzattn.kernels.sdpa_varlen:IMPL"])
def test_a_varlen_declaration_loads_by_module_name(spec):
    """`--impl module:IMPL` probes a varlen declaration with a packed call (one sequence)."""
    impl = load_implementation(spec)
    assert impl.caps.varlen and impl.probe_case is None


def test_every_tile_and_config_the_space_draws_is_taken():
    """Each BLOCK_M x BLOCK_N tile pair runs the packed addressing (tiles past a short
    sequence's end load nothing)."""
    c = packed((1, 33), (40, 2), causal="bottom_right")
    for block_m, block_n in itertools.product((16, 32), (16, 64)):
        config = (("BLOCK_M", block_m), ("BLOCK_N", block_n), ("num_stages", 1), ("num_warps", 4))
        judged = judge(IMPL, c.replace(config=config), "cpu", gradients=False)
        assert judged.passed, (block_m, block_n, judged.first_failure)
