"""Every named check catches a purpose-built bad implementation, and the real ones pass it.

Each bad implementation wraps the correct SDPA adapter and breaks exactly one thing, so the test
shows that the check (not some other check) is what catches it.
"""
from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from fuzzattn import AttentionCase, Capabilities, Implementation, judge
from fuzzattn.contract.varlen import relengthed
from fuzzattn.run.registry import implementations
from fuzzattn.kernels.sdpa import sdpa_forward
from fuzzattn.platform import flight

judge_module = importlib.import_module("fuzzattn.judgement.judge")   # the package re-exports judge()
runs_module = importlib.import_module("fuzzattn.run.runs")

ANY = Capabilities(dtypes={"float32", "bfloat16", "float16"}, head_dims=None,
                   causal=("top_left", "bottom_right"), gqa=True, strides="any")
OUT_BUFFER = dataclasses.replace(ANY, out_buffer=True)

RAGGED = AttentionCase(batch=2, heads=2, kv_heads=2, seq_q=17, seq_k=19, head_dim=16)


def bad(name, fn, caps=ANY):
    return Implementation(name=name, fn=fn, caps=caps, description="purpose-built bad implementation")


def _mutating(q, k, v, *, causal, scale):
    out = sdpa_forward(q, k, v, causal=causal, scale=scale)
    k[0, 0, 0, 0] = 0.0                      # scribbles on an input
    return out


def _writes_past_out(q, k, v, *, causal, scale, out=None, lse=None):
    o, l = sdpa_forward(q, k, v, causal=causal, scale=scale)
    if out is None:
        return o, l
    out.copy_(o)
    lse.copy_(l)
    # one element past the end of out, as a kernel with a wrong tail mask would write
    torch.as_strided(out, (1,), (1,), out.storage_offset() + out.numel()).fill_(0.0)
    return out, lse


def _reads_past_keys(q, k, v, *, causal, scale):
    # one key row more than there is: a missing `k_pos < N_KEYS` load mask
    grow = lambda t: torch.as_strided(t, t.shape[:2] + (t.shape[2] + 1, t.shape[3]), t.stride(),
                                      t.storage_offset())
    o, l = sdpa_forward(q, grow(k), grow(v), causal=False, scale=scale)
    return o, l


def _skips_last_row(q, k, v, *, causal, scale, out=None, lse=None):
    o, l = sdpa_forward(q, k, v, causal=causal, scale=scale)
    if out is None:
        return o, l
    out[:, :, :-1].copy_(o[:, :, :-1])       # the tail row is never written
    lse.copy_(l)
    return out, lse


def _allocates_and_skips_last_row(q, k, v, *, causal, scale):
    o, l = sdpa_forward(q, k, v, causal=causal, scale=scale)
    out = torch.empty_like(o)                 # fresh allocation: stale memory unless written
    out[:, :, :-1] = o[:, :, :-1]
    return out, l


def _no_max_subtraction(q, k, v, *, causal, scale):
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    p = torch.exp(s)                          # overflows to inf for large scores
    out = (p @ v.float()) / p.sum(-1, keepdim=True)
    return out.to(q.dtype), torch.log(p.sum(-1))


def _averages_empty_rows(q, k, v, *, causal, scale):
    o, l = sdpa_forward(q, k, v, causal=causal, scale=scale)
    # a finite sentinel: rows that see no key become the mean of all values
    nq, nk = q.shape[2], k.shape[2]
    empty = torch.arange(nq) + nk - nq < 0
    o[:, :, empty] = v.mean(dim=2, keepdim=True).to(o.dtype)
    l[:, :, empty] = 0.0
    return o, l


def _wrong_scale(q, k, v, *, causal, scale):
    return sdpa_forward(q, k, v, causal=causal, scale=1.0 / q.shape[-1] ** 0.5)


def _lse_base2(q, k, v, *, causal, scale):
    o, l = sdpa_forward(q, k, v, causal=causal, scale=scale)
    return o, l / torch.log(torch.tensor(2.0))


class _CorrectOnce:
    """Right on its first call, garbage afterwards: only the rerun after the references sees it."""

    def __init__(self):
        self.calls = 0

    def __call__(self, q, k, v, *, causal, scale):
        self.calls += 1
        o, l = sdpa_forward(q, k, v, causal=causal, scale=scale)
        return (o, l) if self.calls % 2 == 1 else (torch.zeros_like(o), l)


class _Jittery:
    """Within tolerance every time, never the same bits twice (an atomics-order race)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, q, k, v, *, causal, scale):
        self.calls += 1
        o, l = sdpa_forward(q, k, v, causal=causal, scale=scale)
        return o, l + self.calls * 2.0 ** -22 * l.abs().clamp(min=1)


def _crashes(q, k, v, *, causal, scale):
    raise RuntimeError("the kernel raised (simulated)")


def _wrong_shape(q, k, v, *, causal, scale):
    o, l = sdpa_forward(q, k, v, causal=causal, scale=scale)
    return o[:, :, :, :-1], l


CASES = [
    ("inputs_mutated", bad("mutates_k", _mutating), RAGGED),
    ("out_of_bounds_write", bad("writes_past_out", _writes_past_out, OUT_BUFFER), RAGGED),
    ("out_of_bounds_read", bad("reads_past_keys", _reads_past_keys), RAGGED),
    ("unwritten_output", bad("skips_last_row", _skips_last_row, OUT_BUFFER), RAGGED),
    ("unwritten_output", bad("allocates_and_skips_last_row", _allocates_and_skips_last_row), RAGGED),
    ("nonfinite", bad("no_max_subtraction", _no_max_subtraction), RAGGED.replace(values="large")),
    ("empty_rows", bad("averages_empty_rows", _averages_empty_rows),
     RAGGED.replace(seq_q=20, seq_k=5, causal="bottom_right")),
    ("out", bad("wrong_scale", _wrong_scale), RAGGED.replace(scale=0.5)),
    ("lse", bad("lse_base2", _lse_base2), RAGGED),
    ("rerun", bad("correct_once", _CorrectOnce()), RAGGED),
    ("nondeterministic", bad("jittery", _Jittery()), RAGGED),
    ("crash", bad("crashes", _crashes), RAGGED),
    ("contract", bad("wrong_shape", _wrong_shape), RAGGED),
]


@pytest.mark.parametrize("check,impl,case", [pytest.param(*c, id=c[1].name) for c in CASES])
def test_check_catches_its_bad_implementation(check, impl, case):
    report = judge(impl, case)
    assert not report.passed, report.describe()
    assert report.first_failure.check == check, report.describe()


@pytest.mark.parametrize("check,impl,case", [pytest.param(*c, id=c[1].name) for c in CASES])
@pytest.mark.parametrize("real", sorted(implementations()))
def test_real_implementations_pass_the_same_cases(check, impl, case, real):
    real_impl = implementations()[real]
    case = case.replace(causal="top_left") if case.causal not in ("none",) + real_impl.caps.causal \
        else case
    if case.dtype not in real_impl.caps.dtypes:      # FLASH and cuDNN on CUDA: no fp32
        case = case.replace(dtype=sorted(real_impl.caps.dtypes)[0])
    if not real_impl.supports(case) and real_impl.caps.varlen:   # the same sizes, packed
        case = case.replace(batch=1, **relengthed((7, 10), (9, 10)))
    if not real_impl.supports(case):
        case = case.replace(seq_q=17, seq_k=19, causal="none")
    assert real_impl.supports(case), real_impl.caps.why_not(case)
    report = judge(real_impl, case)
    assert report.passed, report.describe()


def test_implementation_runs_before_and_after_the_references(monkeypatch):
    events = []
    real_oracle = judge_module.oracle

    def logging_oracle(*args, **kwargs):
        events.append("oracle")
        return real_oracle(*args, **kwargs)

    def logging_impl(q, k, v, *, causal, scale):
        events.append("impl")
        return sdpa_forward(q, k, v, causal=causal, scale=scale)

    monkeypatch.setattr(judge_module, "oracle", logging_oracle)
    # As on the CPU, where the references compute on the device the implementation ran on (on
    # an accelerator a small case is judged on the host, and its runs go together: below).
    monkeypatch.setattr(judge_module, "_runs_together", lambda here, device: False)
    report = judge(bad("logger", logging_impl), RAGGED)
    assert report.passed
    assert events == ["impl", "oracle", "impl"]


def test_failure_names_where_it_is():
    # wrong only in batch 1, head 0, rows 3..5: the verdict must say exactly that
    def wrong_rows(q, k, v, *, causal, scale):
        o, l = sdpa_forward(q, k, v, causal=causal, scale=scale)
        o[1, 0, 3:6] += 1.0
        return o, l

    report = judge(bad("wrong_rows", wrong_rows), RAGGED)
    failure = report.first_failure
    assert failure.check == "out"
    assert failure.where == "b1 h0 rows 3-5"
    assert "b1 h0 |...xxx" in failure.heatmap
    assert failure.error > failure.allowed


def test_unwritten_output_is_named_so_whatever_the_heap_held():
    """The attribution re-runs must not depend on malloc handing back a clean block: freed
    NaN-filled blocks of assorted sizes (what earlier tests leave in an xdist worker) once made a
    never-written output read as out_of_bounds_read about one judgement in three."""
    def unwritten(q, k, v, *, causal, scale):
        return torch.empty_like(q), torch.empty(q.shape[:3], dtype=torch.float32)

    impl = Implementation("unwritten", unwritten, Capabilities(dtypes={"float32"}))
    seen = set()
    for i in range(12):
        blocks = [torch.full((n,), float("nan")) for n in range(8, 400, 4 + i % 7)]
        del blocks
        seen.add(judge(impl, AttentionCase(1, 1, 1, 3, 1, 16)).first_failure.check)
    assert seen == {"unwritten_output"}


def test_a_per_shape_compiler_runs_outside_any_dispatch_mode():
    """A Python dispatch mode makes torch.compile'd code run eagerly (flex's higher-order op then
    raised NotImplementedError in the zeroed re-run), so a kernel declaring compiles_per_shape
    is called under none, its attribution re-runs included; other kernels' clean re-runs keep
    the zeroing mode (the test above)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    from fuzzattn.inputs.nan_fill import UninitializedMemoryIsZero
    from fuzzattn.run import runs
    modes = []

    def noting(q, k, v, *, causal, scale):
        modes.append(_get_current_dispatch_mode())
        return sdpa_forward(q, k, v, causal=causal, scale=scale)

    caps = Capabilities(dtypes={"float32"}, compiles_per_shape=True)
    compiled = Implementation("compiled_like", noting, caps)
    case = AttentionCase(1, 1, 1, 3, 5, 16)
    for poison in (True, False):
        runs.run(compiled, case, "cpu", adversarial=True, poison=poison)
    assert modes == [None, None]
    plain = dataclasses.replace(compiled, name="plain", caps=dataclasses.replace(
        caps, compiles_per_shape=False))
    runs.run(plain, case, "cpu", adversarial=True, poison=False)
    assert isinstance(modes[-1], UninitializedMemoryIsZero)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_guarded_buffer_sees_a_write_into_either_guard_and_none_into_its_body(dtype):
    from fuzzattn.run.runs import GuardedBuffer
    for where in ("before", "after", "body", None):
        buffer = GuardedBuffer((2, 3, 5), dtype, "cpu")
        assert torch.isnan(buffer.tensor).all()
        if where == "before":
            buffer.storage[buffer.guard - 1] = 0.0
        elif where == "after":
            buffer.storage[-1] = 0.0
        elif where == "body":
            buffer.tensor.fill_(1.0)
        assert bool(buffer.canary_broken()) == (where in ("before", "after")), where


@pytest.mark.parametrize("check,impl,case", [pytest.param(*c, id=c[1].name) for c in CASES])
def test_runs_read_back_together_catch_the_same_bugs(check, impl, case, monkeypatch):
    """On an accelerator, a case judged on the host has its two runs launched back to back and
    read back in one transfer; forced on here, every check still names its own bug."""
    monkeypatch.setattr(judge_module, "_runs_together", lambda here, device: True)
    stateful = isinstance(impl.fn, (_CorrectOnce, _Jittery))      # a fresh one: its count from 0
    fresh = dataclasses.replace(impl, fn=type(impl.fn)() if stateful else impl.fn)
    report = judge(fresh, case)
    assert not report.passed, report.describe()
    assert report.first_failure.check == check, report.describe()


def test_runs_together_come_before_the_references_and_are_read_back_at_once(monkeypatch):
    events = []
    real_oracle, real_deliver = judge_module.oracle, runs_module.deliver
    monkeypatch.setattr(judge_module, "_runs_together", lambda here, device: True)
    monkeypatch.setattr(judge_module, "oracle",
                        lambda *a, **kw: events.append("oracle") or real_oracle(*a, **kw))
    monkeypatch.setattr(runs_module, "deliver",
                        lambda impl, case, runs, also=(): events.append(f"read back {len(runs)}")
                        or real_deliver(impl, case, runs, also=also))

    def logging_impl(q, k, v, *, causal, scale):
        events.append("impl")
        return sdpa_forward(q, k, v, causal=causal, scale=scale)

    assert judge(bad("logger", logging_impl), RAGGED).passed
    assert events == ["impl", "impl", "read back 2", "oracle"]


@pytest.mark.parametrize("together", [False, True])
def test_a_fault_surfacing_in_the_read_back_is_the_runs_crash(together, monkeypatch):
    """Runs are not synchronised on their own: an asynchronous device fault raises where the
    results are read back, and is judged as the implementation's crash on this case."""
    from fuzzattn.isolation.supervisor import is_device_fault
    monkeypatch.setattr(judge_module, "_runs_together", lambda here, device: together)
    monkeypatch.setattr(flight, "recorder", lambda: None)   # in-process: a watched run would end

    def faulted(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore text")

    monkeypatch.setattr(runs_module, "read_back", faulted)
    report = judge(implementations()["sdpa"], RAGGED)
    assert not report.passed and report.first_failure.check == "crash"
    assert report.first_failure.detail == ("RuntimeError: CUDA error: an illegal memory access "
                                           "was encountered")
    assert is_device_fault(report.first_failure.detail)
    assert [v.check for v in report.verdicts] == ["crash"]


def test_a_fault_surfacing_in_the_backwards_read_back_is_its_crash(monkeypatch):
    gradients_module = importlib.import_module("fuzzattn.gradients.backward_runs")
    monkeypatch.setattr(flight, "recorder", lambda: None)   # in-process: a watched run would end

    def faulted(*args, **kwargs):
        raise RuntimeError("CUDA error: misaligned address")

    monkeypatch.setattr(gradients_module, "read_back", faulted)
    report = judge(implementations()["sdpa"], RAGGED)
    assert not report.passed and report.first_failure.check == "grad_crash"
    assert report.first_failure.detail == \
        "backward raised: RuntimeError: CUDA error: misaligned address"


def test_same_bits_pairs():
    a = torch.tensor([1.0, float("nan"), -0.0])
    assert runs_module.same_bits([(a, a.clone()), (a, torch.tensor([1.0, float("nan"), 0.0])),
                                   (None, a), (a, a[:2]), (a, a.double())]) == \
        [True, False, True, False, False]


def test_a_second_run_is_judged_on_its_outputs_alone(monkeypatch):
    """The judgement's second run (forward and backward) computes no side-effect flags: the
    first run's checks cover the inputs, and nothing ever read the second run's. A mutation is
    still caught, once, by the first run's check."""
    flagged = []
    original = runs_module.changed_flags
    monkeypatch.setattr(runs_module, "changed_flags",
                        lambda *a, **k: flagged.append(1) or original(*a, **k))
    pristine = runs_module.materialize(RAGGED, "cpu")
    second = runs_module.run(bad("mutates_k", _mutating), RAGGED, "cpu", adversarial=False,
                             inputs=pristine.copy(), side_effects=False)
    assert flagged == [] and second.side_effects == [] and second.call.answered
    assert second.delivered is not None and torch.equal(second.delivered[1], second.out)
    judged = judge(bad("mutates_k", _mutating), RAGGED, "cpu", gradients=False)
    mutated = [v for v in judged.verdicts if v.check == "inputs_mutated"]
    assert len(mutated) == 1 and not mutated[0].passed and "k" in mutated[0].detail


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_crashing_kernels_memory_is_freed_without_the_collector(where):
    """A crash keeps its message, not its traceback: the traceback's frames hold the inputs and
    the kernel's temporaries (device memory on a GPU) in a reference cycle that only the
    collector frees, and late (fuzzattn/platform/gc_tuning.py makes its full passes rarer). With the collector
    off, every tensor a crashing kernel made is gone once the judgement returns."""
    import gc
    import weakref
    made = []

    def blows_up(*args, **kwargs):
        temporary = torch.ones(256, 256)
        made.append(weakref.ref(temporary))
        raise RuntimeError("the kernel blew up") from ValueError("its cause")

    def backward(q, k, v, out, lse, dout, *, causal, scale):
        return blows_up()

    forward = sdpa_forward if where == "backward" else blows_up
    impl = Implementation(f"crashes_in_{where}", forward,
                          dataclasses.replace(ANY, backward=where == "backward"),
                          backward_fn=backward if where == "backward" else None)
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            judged = judge(impl, RAGGED)
            assert judged.first_failure.check == ("grad_crash" if where == "backward" else "crash")
            assert "the kernel blew up" in judged.first_failure.detail
        assert made and all(ref() is None for ref in made)
    finally:
        gc.enable()
