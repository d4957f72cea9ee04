"""Where a case's values come from (fuzzattn/inputs/sources.py): the counter generator is
SplitMix64 bit for bit, its values have the moments they claim, counter cases materialise the
same bits on every device (the GPU test), and CPU-generator cases keep the bits every saved
file pins."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, seed, settings

from fuzzattn import AttentionCase
from fuzzattn.contract.case import CaseError
from fuzzattn.contract.profiles import PROFILES
from fuzzattn.inputs.materialize import as_bits, inputs_sha256, materialize, materialize_dout
from fuzzattn.inputs.sources import CounterSource, CpuSource, mix_int, source
from fuzzattn.strategies import attention_cases

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: CPU and GPU bits")
M64 = (1 << 64) - 1


def _splitmix64(seed: int, n: int) -> list[int]:
    """SplitMix64 in plain Python integers (Steele, Lea, Flood 2014), written out again here so
    the torch version, with its masked arithmetic shifts and wrapping int64 products, is checked
    against the definition rather than against itself."""
    state = mix_int(seed)
    out = []
    for i in range(n):
        z = (state + i * 0x9E3779B97F4A7C15) & M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        out.append(z ^ (z >> 31))
    return out


@pytest.mark.parametrize("seed_value", [0, 1, 12345, 2**31 - 1, 2**63 - 1])
def test_the_counter_stream_is_splitmix64_bit_for_bit(seed_value):
    got = [x & M64 for x in CounterSource(seed_value).bits(64).tolist()]
    assert got == _splitmix64(seed_value, 64)


def test_successive_draws_continue_the_stream():
    whole = CounterSource(7).bits(30)
    parts = CounterSource(7)
    assert torch.equal(torch.cat([parts.bits(10), parts.bits(20)]), whole)


def test_normal_values_are_irwin_hall_of_the_four_16_bit_fields():
    g = CounterSource(3)
    values = g.normal((5,))
    for value, word in zip(values.tolist(), _splitmix64(3, 5)):
        fields = sum((word >> s) & 0xFFFF for s in (0, 16, 32, 48))
        assert value == pytest.approx((fields - 131070) / math.sqrt((2**32 - 1) / 3), rel=1e-7)


def test_normal_values_have_mean_zero_unit_variance_and_bounded_tails():
    x = CounterSource(11).normal((400_000,)).double()
    assert x.dtype == torch.float64 and abs(float(x.mean())) < 0.01
    assert abs(float(x.std()) - 1.0) < 0.01
    assert float(x.abs().max()) <= math.sqrt(12.0) + 1e-6        # Irwin-Hall n=4: at most sqrt(12)
    assert float(x.abs().max()) > 3.0                              # the tails are reached


def test_integers_and_coins_cover_their_range_evenly():
    g = CounterSource(5)
    ints = g.integers(1, 33, (64_000,))
    assert int(ints.min()) == 1 and int(ints.max()) == 32
    counts = torch.bincount(ints - 1, minlength=32).double()
    assert float((counts / 2000 - 1).abs().max()) < 0.1
    coins = g.coin((64_000,))
    assert coins.dtype == torch.bool and abs(float(coins.double().mean()) - 0.5) < 0.01


def test_the_cpu_source_draws_what_the_cpu_generator_always_drew():
    g = torch.Generator().manual_seed(9)
    want = [torch.randn((2, 3), generator=g), torch.randint(0, 5, (4,), generator=g),
            torch.rand((6,), generator=g) < 0.5]
    s = CpuSource(9)
    got = [s.normal((2, 3)), s.integers(0, 5, (4,)), s.coin((6,))]
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_an_unknown_generator_is_one_line_naming_it():
    with pytest.raises(ValueError, match="generator='philox'"):
        source("philox", 0)
    with pytest.raises(CaseError, match="generator='philox' is not one of"):
        AttentionCase(1, 1, 1, 2, 2, 8, generator="philox")


def test_cpu_generator_cases_keep_their_key_and_file_form():
    case = AttentionCase(1, 2, 1, 5, 7, 16, data_seed=3)
    assert "generator" not in case.to_dict() and "generator" not in str(case)
    counter = case.replace(generator="counter")
    assert counter.to_dict()["generator"] == "counter" and "generator=counter" in str(counter)
    assert counter.key() != case.key()
    assert AttentionCase.from_dict(counter.to_dict()) == counter
    assert AttentionCase.from_dict(case.to_dict()) == case


# sha256 prefixes of counter cases' inputs, one per value profile: a change to the generator or
# to how a profile uses it changes these, and every saved counter case with them.
PINNED = {
    "normal": "76e6fe58a769",
    "large": "196800d8f737",
    "near_constant": "9a965b44dbbf",
    "dominant_key": "5f8dd9178d4b",
    "zero_query_rows": "f07c5bbdb3a3",
    "below_sentinel": "3d8a2dc579a2",
    "sentinel_sweep": "bcb97bf82642",
    "exact_mean": "1ab5dc0d976e",
}


def _counter_case(values: str, dtype: str = "bfloat16") -> AttentionCase:
    return AttentionCase(2, 4, 2, 17, 33, 24, dtype=dtype, values=values, data_seed=5,
                         generator="counter", layout=("sliced", "transposed", "broadcast_heads"))


@pytest.mark.parametrize("values", sorted(PINNED))
def test_counter_cases_materialise_pinned_bits(values):
    case = _counter_case(values)
    assert inputs_sha256(materialize(case)).startswith(PINNED[values])
    assert inputs_sha256(materialize(case)) != inputs_sha256(materialize(case.replace(generator="torch_cpu")))


def test_counter_inputs_keep_the_guards_and_layouts_of_cpu_generator_inputs():
    case = _counter_case("normal")
    a, b = materialize(case), materialize(case.replace(generator="torch_cpu"))
    for name in "qkv":
        ta, tb = getattr(a, name), getattr(b, name)
        assert ta.shape == tb.shape and ta.stride() == tb.stride()
        assert ta.storage_offset() == tb.storage_offset()
        assert a.storages[name].shape == b.storages[name].shape
        assert torch.isnan(a.storages[name].float()).sum() == torch.isnan(b.storages[name].float()).sum()


def _drawn(profile, count=150) -> list[AttentionCase]:
    drawn = []

    @seed(0)
    @settings(max_examples=count, database=None, deadline=None)
    @given(attention_cases(dtype="float32", profile=profile))
    def draw(case):
        drawn.append(case)

    draw()
    return drawn


def test_a_profile_gives_counter_values_to_cases_above_its_bound():
    profile = dataclasses.replace(PROFILES["gpu"], device_values_macs=2**21)
    kinds = set()
    for case in _drawn(profile):
        assert case.generator == ("counter" if case.macs > 2**21 else "torch_cpu"), case
        kinds.add(case.generator)
    assert kinds == {"counter", "torch_cpu"}          # both kinds were drawn


def test_the_gpu_profiles_give_every_case_counter_values():
    assert PROFILES["gpu"].device_values_macs == 0 == PROFILES["nightly"].device_values_macs
    assert {case.generator for case in _drawn(PROFILES["gpu"], 40)} == {"counter"}


def test_a_host_copy_read_back_with_other_results_is_adopted_with_the_same_views():
    from fuzzattn.inputs.materialize import _born_on
    case = _counter_case("dominant_key", "float16")
    inputs = _born_on(case, torch.device("cpu"), torch.float16, float("nan"))
    assert inputs.host is None
    inputs.keep_host_copy(inputs.packed.clone())
    host = inputs.host          # (on a GPU, what inputs.on("cpu") then returns)
    assert host.packed.data_ptr() != inputs.packed.data_ptr()
    for name in "qkv":
        a, b = getattr(inputs, name), getattr(host, name)
        assert a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(as_bits(inputs.storages[name]), as_bits(host.storages[name]))
    assert inputs_sha256(host) == inputs_sha256(materialize(case))


def test_the_cpu_profiles_never_draw_counter_values():
    assert PROFILES["ci"].device_values_macs is None and PROFILES["dev"].device_values_macs is None


@CUDA
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("values", sorted(PINNED))
def test_counter_cases_are_born_on_the_gpu_with_the_cpu_bits(values, dtype):
    case = _counter_case(values, dtype)
    on_gpu, on_cpu = materialize(case, "cuda"), materialize(case, "cpu")
    assert on_gpu.host is None and on_gpu.packed is not None and on_gpu.q.is_cuda
    for name in "qkv":
        assert torch.equal(as_bits(on_gpu.storages[name]).cpu(), as_bits(on_cpu.storages[name]))
    assert inputs_sha256(on_gpu) == inputs_sha256(on_cpu)
    assert on_gpu.host is not None                      # read back once, then kept
    (gs, gv), (cs, cv) = materialize_dout(case, "cuda"), materialize_dout(case, "cpu")
    assert gs.is_cuda and torch.equal(as_bits(gs).cpu(), as_bits(cs))
    assert gv.stride() == cv.stride()


@CUDA
@pytest.mark.parametrize("case", [
    # references on the device, checks on the host (fuzzattn/judging/placement.py)
    AttentionCase(2, 4, 2, 300, 280, 64, causal="bottom_right", data_seed=3, generator="counter"),
    # small: references and checks on the host, from the inputs (and dO) read back with the
    # runs' outputs
    AttentionCase(1, 2, 1, 9, 13, 16, values="dominant_key", data_seed=4, generator="counter"),
], ids=str)
def test_a_counter_case_is_judged_on_the_gpu_from_values_computed_there(case, monkeypatch):
    from fuzzattn.inputs import sources as value_sources
    from fuzzattn.judgement.judge import judge
    from fuzzattn.run.registry import implementations

    devices = []
    original = value_sources.CounterSource.__init__

    def spy(self, seed_value, device="cpu"):
        original(self, seed_value, device)
        devices.append(self.device.type)

    monkeypatch.setattr(value_sources.CounterSource, "__init__", spy)
    judged = judge(implementations()["sdpa"], case, "cuda")
    assert judged.passed, judged.describe()
    assert any(v.check == "grad_dq" for v in judged.verdicts)          # the gradients were judged
    assert devices and set(devices) == {"cuda"}                          # never generated on the CPU


@pytest.mark.parametrize("seed_value,position,n", [(0, 0, 1), (5, 7, 1000), (12345, 3000, 5000),
                                                    (2**63 - 1, 2**33, 2049)])
def test_the_fused_kernel_gives_the_torch_versions_bits(seed_value, position, n):
    """Compiled on a GPU, interpreted on the CPU: the same values either way as the torch ops."""
    from fuzzattn.inputs.sources import fused_normals
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = torch.empty(n, device=device)
    fused_normals(out, position, mix_int(seed_value))
    g = CounterSource(seed_value)
    g.position = position
    assert torch.equal(as_bits(out).cpu(), as_bits(g.normal((n,))))


def test_the_fused_kernel_serves_only_after_agreeing_with_the_torch_ops(monkeypatch, capsys):
    """Checked once per device and process: a kernel that fails to run or gives other bits
    leaves the torch operations in charge, said in one line."""
    from fuzzattn.triton_interpreter import backend as triton_backend
    from fuzzattn.inputs import sources as vs
    monkeypatch.setattr(triton_backend, "is_interpreted", lambda: False)
    # On the CPU the interpreter's kernel stands in for a compiled one.
    here = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        vs._fused_here.cache_clear()
        assert vs._fused_here(here)
        vs._fused_here.cache_clear()

        def broken(out, position, base):
            raise RuntimeError("no kernel image for this device")

        monkeypatch.setattr(vs, "fused_normals", broken)
        assert not vs._fused_here(here)
        assert "failed (RuntimeError: no kernel image for this device)" in capsys.readouterr().err
        vs._fused_here.cache_clear()
        monkeypatch.setattr(vs, "fused_normals", lambda out, position, base: out.fill_(1.0))
        assert not vs._fused_here(here)
        assert "bits differ" in capsys.readouterr().err
    finally:
        vs._fused_here.cache_clear()


# -- the profiles sources.py builds -----------------------------------------------------------
SWEEP_CASES = [AttentionCase(2, 4, 2, 7, 19, d, dtype=dtype, scale=scale, values="sentinel_sweep",
                             data_seed=seed_value, layout=("sliced", "transposed", "contiguous"))
               for dtype in ("float32", "bfloat16", "float16")
               for d, scale in ((1, None), (3, 0.125), (16, 2.0), (64, None), (96, 1.0), (256, None))
               for seed_value in range(6)]


@pytest.mark.parametrize("case", SWEEP_CASES, ids=str)
def test_sweep_scores_lie_past_minus_the_cases_magnitude_by_at_most_2x(case):
    """Every score is the same -2^e scale with T < 2^e |scale| <= 2T: past a sentinel of
    magnitude T and not far past it. q.k is a power of two, exact in fp32 whatever the order,
    so its product with any scale is exact too (a kernel that fuses s * c - m into one FMA
    subtracts the max exactly), and the scores stay finite before the scale and in base 2."""
    from fuzzattn.inputs.sources import FP32_MAX, LOG2E, sentinel_magnitude
    magnitude = sentinel_magnitude(case)
    inputs = materialize(case)
    k = inputs.k.repeat_interleave(case.group_size, dim=1)
    dots = inputs.q.double() @ k.double().transpose(-1, -2)
    assert torch.equal((inputs.q.float() @ k.float().transpose(-1, -2)).double(), dots)
    assert len(torch.unique(dots)) == 1 and math.frexp(dots.flatten()[0].item())[0] == -0.5
    scores = dots * case.softmax_scale
    assert -2 * magnitude <= scores.max() < -magnitude
    assert dots.abs().max() < FP32_MAX and scores.abs().max() * LOG2E < FP32_MAX


def test_the_sweep_reaches_every_sentinel_magnitude_a_case_allows():
    """Over data seeds, each reachable magnitude is drawn: every decade a dtype holds, fp16's
    lowest value and half of it, and (at scale 1) half of bf16's and fp32's lowest."""
    from fuzzattn.inputs.sources import reachable_magnitudes, sentinel_magnitude
    for dtype, limits, top in (("float16", (32752.0, 65504.0), 1e10),
                               ("bfloat16", (float(torch.finfo(torch.bfloat16).max) / 2,), 1e38),
                               ("float32", (float(torch.finfo(torch.float32).max) / 2,), 1e38)):
        case = AttentionCase(1, 1, 1, 4, 4, 64, dtype=dtype, scale=1.0, values="sentinel_sweep")
        drawn = {sentinel_magnitude(case.replace(data_seed=s)) for s in range(3000)}
        assert drawn == set(reachable_magnitudes(dtype, 64, 1.0))
        assert set(limits) <= drawn and {10.0, 1e4, 1e9, top} <= drawn


def test_the_sweep_scores_lie_past_each_sentinel_they_target():
    """A sentinel of magnitude T (a mask fill) loses to every real score of a T-case."""
    from fuzzattn.inputs.sources import sentinel_magnitude
    for seed_value in range(40):
        case = AttentionCase(1, 2, 1, 3, 9, 40, dtype="bfloat16", scale=1.0,
                             values="sentinel_sweep", data_seed=seed_value)
        inputs = materialize(case)
        scores = (inputs.q.float() @ inputs.k.float().transpose(-1, -2)) * case.softmax_scale
        assert bool((scores < -sentinel_magnitude(case)).all())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_exact_mean_outputs_are_representable_and_running_sums_are_not(dtype):
    """q = 0 and v constant along the keys: every row's output is that constant, exactly, in
    the case's dtype, whatever keys the row sees; n * c for a count n needs more bits than the
    dtype has, for most columns."""
    case = AttentionCase(2, 4, 2, 9, 45, 32, dtype=dtype, causal="bottom_right",
                         values="exact_mean", data_seed=3)
    inputs = materialize(case)
    assert not inputs.q.any()
    v = inputs.v.float()
    assert torch.equal(v, v[:, :, :1].expand_as(v))
    c = v[:, :, 0].double()
    assert bool(((c.abs() >= 1 / 16) & (c.abs() < 1 / 4)).all())
    sums = 45 * c
    assert (sums.to(inputs.v.dtype).double() != sums).float().mean() > 0.5
    oracle = torch.softmax(torch.zeros(45, dtype=torch.float64), 0) @ v[0, 0].double()
    assert torch.equal(oracle.to(inputs.v.dtype).double(), c[0, 0])


def test_exact_mean_keeps_standard_normal_values_in_fp32():
    """An fp32 output is only as exact as a kernel's normalisation: fp32 cases get q = 0 and the
    standard normal v of zero_query_rows' zero rows instead."""
    case = AttentionCase(1, 2, 1, 5, 33, 16, values="exact_mean", data_seed=2)
    inputs = materialize(case)
    assert not inputs.q.any()
    assert torch.equal(inputs.v, materialize(case.replace(values="normal")).v)
