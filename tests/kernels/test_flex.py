"""FlexAttention (`flex`, kernels/flex.py): its declaration, a few judged cases, and the shape
palette that lets a campaign on a kernel compiled per shape reuse its compiles.

Each new shape compiles (10-40 s on a small CPU), so the judged cases here are few, small, and
share shapes: the mutated mask below reuses the compile of the top-left case."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from fuzzattn import AttentionCase, check_case
from fuzzattn.campaigns.compile_palette import campaign_palette
from fuzzattn.contract import Capabilities
from fuzzattn.contract.capabilities import UnsupportedCaseError
from fuzzattn.contract.profiles import PROFILES
from fuzzattn.kernels import flex
from fuzzattn.run import registry
from fuzzattn.strategies import attention_cases
from fuzzattn.strategies import shape_palette
from fuzzattn.strategies.shape_palette import FAMILIES, entries, palette_size

ON_CUDA = torch.cuda.is_available()
TOP_LEFT = AttentionCase(batch=2, heads=2, kv_heads=1, seq_q=5, seq_k=17, head_dim=16,
                         dtype="float32", causal="top_left",
                         layout=("transposed", "sliced", "broadcast_batch"))


def _shape(case: AttentionCase) -> tuple:
    """What the compiled flex is specialised on besides causal and dtype."""
    return (case.batch, case.heads, case.kv_heads, case.seq_q, case.seq_k, case.head_dim,
            case.scale, case.layout)


def _draw(caps, palette, n, dtype="float32", profile="dev", **kw) -> list[AttentionCase]:
    seen = []

    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(attention_cases(caps, dtype=dtype, profile=PROFILES[profile], palette=palette, **kw))
    def draw(case):
        seen.append(case)

    draw()
    return seen


# -- the declaration ----------------------------------------------------------------------------
def test_flex_is_registered_where_it_can_be_judged_and_declares_what_the_device_runs():
    impl = flex.IMPL
    caps = impl.caps
    assert flex.UNAVAILABLE is None          # torch 2.13 has flex_attention and return_aux
    if ON_CUDA:
        assert registry.get("flex") is impl and flex.CPU_DEFECT is None
    else:                                    # see test_the_cpu_compiled_flex_is_wrong_for_some_lengths
        assert "flex" not in registry.implementations() and "NaN" in flex.CPU_DEFECT
    assert caps.compiles_per_shape and caps.palette_shapes == flex.PALETTE_SHAPES
    assert caps.dtypes == {"float32", "bfloat16", "float16"}
    assert caps.causal == ("top_left", "bottom_right") and caps.gqa and caps.strides == "any"
    assert not caps.zero_length
    # The CPU's compiled flex has no lse and no backward; CUDA's has both, and needs D >= 16.
    assert caps.returns_lse == caps.backward == ON_CUDA
    assert (min(caps.head_dims) == 16) if ON_CUDA else caps.head_dims is None


@pytest.mark.skipif(ON_CUDA, reason="the CPU declaration")
def test_the_cpu_compiled_flex_cannot_return_lse_which_is_why_none_is_declared():
    """When a torch release adds it, this fails: declare returns_lse on the CPU then."""
    from torch.nn.attention.flex_attention import AuxRequest
    q = torch.randn(1, 1, 3, 4)
    with flex._limits(), pytest.raises(Exception, match="return_lse` is not supported"):
        flex._flex()(q, q, q, return_aux=AuxRequest(lse=True))


@pytest.mark.skipif(ON_CUDA, reason="the CPU's compiled flex (inductor's C++ template)")
def test_the_cpu_compiled_flex_is_wrong_for_some_lengths_which_is_why_it_is_not_registered():
    """Compiled and eager flex on the same inputs, no mask: eager agrees with SDPA, the compiled
    CPU kernel does not on at least one of these lengths. When a torch release fixes it, this
    fails: register flex on the CPU then (kernels/flex.py, REGISTERED)."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for seq_q, seq_k in ((16, 40), (8, 40)):
        q = torch.randn(1, 1, seq_q, 16, generator=generator)
        k, v = (torch.randn(1, 1, seq_k, 16, generator=generator) for _ in range(2))
        reference = F.scaled_dot_product_attention(q, k, v, scale=0.25)
        assert torch.allclose(flex_attention(q, k, v, scale=0.25), reference, atol=1e-5)
        with flex._limits():
            compiled = flex._flex()(q, k, v, scale=0.25)
        error = (compiled - reference).abs().max().item()
        worst = float("inf") if error != error else max(worst, error)
    if worst <= 0.1:
        # inductor's C++ template is generated for the host's vector ISA: the wrong lengths
        # were measured on one CPU, and this one computes them right
        pytest.skip(f"compiled CPU flex agrees with eager on this CPU (worst error {worst:.3g}); "
                    "if it agrees on every CPU a torch release supports, register it")


def test_undeclared_inputs_are_refused_in_one_line():
    q = torch.randn(1, 1, 0, 16)
    with pytest.raises(UnsupportedCaseError, match=r"zero length \(seq_q, seq_k\)=\(0, 0\) is not supported"):
        flex.flex_forward(q, q, q, causal=False, scale=0.25)
    q = torch.randn(1, 1, 2, 16, dtype=torch.float64)
    with pytest.raises(UnsupportedCaseError, match=r"q.dtype='torch.float64' is not supported"):
        flex.flex_forward(q, q, q, causal=False, scale=0.25)
    q = torch.randn(1, 1, 2, 16)
    with pytest.raises(UnsupportedCaseError, match=r"causal='diagonal' is not supported"):
        flex.flex_forward(q, q, q, causal="diagonal", scale=0.25)


def test_the_known_decoding_defect_covers_exactly_masked_groups_past_the_sparse_block():
    """kernels/flex.py's predicate: a block mask, Nq < 128, a power-of-two group G > 1 and
    Nq * G > 128."""
    covers = [d for d in flex.KNOWN_DEFECTS if d.regression == "ab18a9f314cb.json"][0].applies
    def case(seq_q, heads, kv_heads=1, causal="top_left"):
        return AttentionCase(batch=1, heads=heads, kv_heads=kv_heads, seq_q=seq_q, seq_k=9,
                             head_dim=16, dtype="float32", causal=causal)
    assert covers(case(65, 2)) and covers(case(60, 12, 3)) and covers(case(67, 4, 2, "bottom_right"))
    assert not covers(case(65, 2, causal="none"))   # flex's own block spans the sequence
    assert not covers(case(64, 2))           # 128 rows: one sparse block
    assert not covers(case(65, 3))           # not a power of two: the main kernel
    assert not covers(case(65, 2, 2))        # no group
    assert not covers(case(128, 2))          # not decoding
    assert flex.IMPL.caps.known_defects == flex.KNOWN_DEFECTS


@pytest.mark.skipif(not ON_CUDA, reason="CUDA's compiled flex (flex decoding is a Triton template)")
@pytest.mark.parametrize("seq_q, heads, causal", [(65, 2, True), (64, 2, True), (65, 3, True),
                                                  (65, 2, False)])
def test_flex_decoding_fails_to_compile_exactly_where_the_known_defect_says(seq_q, heads, causal):
    """Upstream behaviour the known defect rests on: when a torch release fixes it this fails;
    drop the KnownDefect and the file's expected_failures entry then."""
    q = torch.randn(1, heads, seq_q, 16, device="cuda")
    k = torch.randn(1, 1, 9, 16, device="cuda")
    covered = flex._decoding_rows_past_the_sparse_block(AttentionCase(
        batch=1, heads=heads, kv_heads=1, seq_q=seq_q, seq_k=9, head_dim=16, dtype="float32",
        causal="top_left" if causal else "none"))
    if covered:
        with pytest.raises(Exception, match="NoValidChoicesError"):
            flex.flex_forward(q, k, k, causal=causal, scale=0.25)
    else:
        out, lse = flex.flex_forward(q, k, k, causal=causal, scale=0.25)
        assert out.shape == q.shape and torch.isfinite(out).all()


def test_the_registry_imports_flex_without_torch_compile():
    """torch._dynamo (2.3 s of each process on the CPU) is imported when flex first runs, not by
    every process that imports the registry."""
    script = ("import sys, fuzzattn.kernels; from fuzzattn.run.registry import implementations\n"
              "implementations(); print(sorted(m for m in ('torch._dynamo', 'torch._inductor') "
              "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_a_call_raises_the_recompile_limits_and_never_falls_back_to_eager():
    import torch._dynamo
    before = torch._dynamo.config.recompile_limit
    with flex._limits():
        assert torch._dynamo.config.recompile_limit == flex.RECOMPILE_LIMIT
        assert torch._dynamo.config.accumulated_recompile_limit == flex.RECOMPILE_LIMIT
        assert torch._dynamo.config.fail_on_recompile_limit_hit
    assert torch._dynamo.config.recompile_limit == before        # only for the call
    # One mask function per offset: a shape seen again compiles nothing new.
    assert flex._visible(3, "cpu") is flex._visible(3, "cpu")


# -- judged cases (each new shape compiles) -----------------------------------------------------
@pytest.mark.parametrize("case", [
    TOP_LEFT,
    # bottom-right with Nq > Nk: the first 4 rows see no key (out 0, lse -inf), GQA
    AttentionCase(batch=1, heads=2, kv_heads=1, seq_q=9, seq_k=5, head_dim=16, dtype="float32",
                  causal="bottom_right"),
    AttentionCase(batch=1, heads=2, kv_heads=2, seq_q=7, seq_k=20, head_dim=24, dtype="bfloat16",
                  scale=2.0, values="large"),
], ids=["top_left_layouts", "bottom_right_empty_rows", "bf16_large"])
def test_flex_passes_fixed_cases(case):
    check_case(flex.IMPL, case, save_to_file=False)


def test_both_alignments_of_a_shape_share_one_compile():
    from torch._dynamo.utils import counters
    check_case(flex.IMPL, TOP_LEFT, save_to_file=False)
    compiled = counters["stats"]["unique_graphs"]
    check_case(flex.IMPL, TOP_LEFT.replace(causal="bottom_right"), save_to_file=False)
    assert counters["stats"]["unique_graphs"] == compiled


def test_a_wrong_mask_is_caught(monkeypatch):
    """The judge sees flex's own mask: bottom-right built with top-left's offset fails."""
    original = flex._block_mask.__wrapped__
    monkeypatch.setattr(flex, "_block_mask",
                        lambda nq, nk, causal, device: original(nq, nk, "top_left", device))
    with pytest.raises(AssertionError, match=r"\[FAIL\] flex"):
        # another data seed: verdicts are remembered per case, and this one passed above
        check_case(flex.IMPL, TOP_LEFT.replace(causal="bottom_right", data_seed=1), save_to_file=False)


# -- the shape palette --------------------------------------------------------------------------
def test_a_palette_campaign_reuses_few_shapes_and_varies_the_rest(monkeypatch):
    monkeypatch.delenv(shape_palette.ENV, raising=False)
    seen = _draw(flex.CAPS, 3, 200)
    shapes = {_shape(c) for c in seen}
    assert len(shapes) <= flex.PALETTE_SHAPES
    # The rest includes the variants flex declares: Hypothesis often varies a window or softcap
    # and keeps the data seed, so the seeds alone are fewer (about 100 of 200 draws).
    assert len({(c.data_seed, c.window, c.softcap) for c in seen}) > 100
    assert len({c.values for c in seen}) > 3
    assert len({c.causal for c in seen}) == 3
    # Without a palette the same budget draws a new shape nearly every case.
    assert len({_shape(c) for c in _draw(flex.CAPS, None, 200)}) > 100


def test_palettes_cover_every_family_over_campaigns_and_fit_the_declaration():
    caps = Capabilities(dtypes={"float32"}, gqa=True, seq_multiple=4, min_seq_len=8,
                        compiles_per_shape=True, palette_shapes=4)
    families = set()
    for number in range(len(FAMILIES)):
        palette = entries(caps, PROFILES["dev"], number, 4)
        assert len({e.family for e in palette}) == 4 and palette == entries(caps, PROFILES["dev"], number, 4)
        assert [e.size for e in palette] == sorted(e.size for e in palette)
        families |= {e.family for e in palette}
        for e in palette:
            assert caps.why_not_lengths(e.seq_q, e.seq_k) is None, e
            assert e.head_dim in (16, 32, 64, 128) and e.group <= 2 and e.kv_heads <= 2
            if e.family == "decode":
                assert e.seq_q == 8          # 1, moved up to the declared minimum
            if e.family == "tall":
                assert e.seq_q > e.seq_k
            if e.family == "ragged":
                assert caps.seq_multiple > 1 or (e.seq_q % 16 and e.seq_k % 16)
    assert families == set(FAMILIES)


def test_only_declared_per_shape_compilers_get_a_shape_palette(monkeypatch):
    monkeypatch.delenv("FUZZATTN_PALETTE", raising=False)
    assert campaign_palette(flex.IMPL, 7) == 7                    # compiled on the CPU too
    assert campaign_palette(registry.get("sdpa"), 7) is None
    monkeypatch.setenv("FUZZATTN_PALETTE", "off")
    assert campaign_palette(flex.IMPL, 7) is None
    # A palette number without the declaration narrows no shape.
    plain = Capabilities(dtypes={"float32"})
    assert len({_shape(c) for c in _draw(plain, 3, 60)}) > 20


def test_fuzzattn_shapes_sizes_the_palette(monkeypatch):
    monkeypatch.setenv(shape_palette.ENV, "2")
    assert palette_size(flex.CAPS) == 2
    assert len({_shape(c) for c in _draw(flex.CAPS, 5, 80)}) <= 2
    assert len({_shape(c) for c in _draw(flex.CAPS, 5, 80, shapes=6)}) <= 6
    for bad in ("0", "two", "-3"):
        monkeypatch.setenv(shape_palette.ENV, bad)
        with pytest.raises(ValueError, match=f"FUZZATTN_SHAPES='{bad}' is not a positive integer"):
            palette_size(flex.CAPS)
    monkeypatch.delenv(shape_palette.ENV)
    assert palette_size(flex.CAPS) == flex.PALETTE_SHAPES
    with pytest.raises(ValueError, match="palette_shapes=0 must be >= 1"):
        Capabilities(palette_shapes=0)
