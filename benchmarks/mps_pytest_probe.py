"""The pytest half of the MPS fault probe (benchmarks/gpu_speed_call.sh, mode `mpspytest`), run
as users run the suite: `pytest -n 4 benchmarks/mps_pytest_probe.py` on a GPU.

test_faults waits FAULT_AFTER seconds, so that every worker is judging sdpa, then judges
tests/isolation_kernels.py's TRITON_OOB at seq_q = 5: a real illegal memory access. The sdpa
tests judge a passing fp32 case for a second each. What fuzzattn/pytest_plugin.py must make of it:
- without MPS: test_faults fails with its crash verdict, its worker (whose CUDA context is lost)
  is replaced, and every sdpa test passes;
- under MPS: the session stops (exit status 2, an `Interrupted: fuzzattn: ...` line naming the
  test and the fault), every worker with it, within seconds, and no sdpa test fails with a verdict
  against sdpa (one may fail with the same SharedDeviceFault: MPS delivers the fault to it too).
Not collected by the suite (its name is not test_*.py): only ever run by name, on a GPU.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from fuzzattn import AttentionCase
from fuzzattn.judge.judge import judge
from fuzzattn.run.loader import load_implementation
from fuzzattn.run.registry import implementations

KERNELS = Path(__file__).resolve().parent.parent / "tests" / "isolation_kernels.py"
FAULT_AFTER = 6.0
SDPA_CASE = AttentionCase(batch=2, heads=4, kv_heads=4, seq_q=64, seq_k=64, head_dim=32)


def test_faults():
    time.sleep(FAULT_AFTER)
    impl = load_implementation(f"{KERNELS}:TRITON_OOB", probe=False)
    judged = judge(impl, AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=5, seq_k=2,
                                       head_dim=16), device="cuda")
    assert judged.passed, judged.describe()


@pytest.mark.parametrize("i", range(60))
def test_sdpa(i):
    impl = implementations()["sdpa"]
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        judged = judge(impl, SDPA_CASE, device="cuda")
        assert judged.passed, judged.describe()
