"""How a process waits for the GPU (fuzzattn/platform/cuda_waits.py) and the frozen heap (fuzzattn/platform/gc_tuning.py):
set up once per process, before judging; neither may change a verdict, only the host's time."""
from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest
import torch

from fuzzattn.platform import gc_tuning as heap
from fuzzattn.cli import main as cli_main
from fuzzattn.platform import cuda_waits


class FakeDriver:
    """The five driver calls apply() makes, on `devices` primary contexts with `flags` each."""

    def __init__(self, flags, refuse=()):
        self.flags = list(flags)
        self.refuse = set(refuse)
        self.set_calls = []

    def cuDeviceGetCount(self, count):
        count._obj.value = len(self.flags)
        return 0

    def cuDeviceGet(self, dev, ordinal):
        dev._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxGetState(self, dev, flags, active):
        flags._obj.value = self.flags[dev.value]
        active._obj.value = 0
        return 0

    def cuDevicePrimaryCtxSetFlags_v2(self, dev, flags):
        self.set_calls.append((dev.value, flags))
        if dev.value in self.refuse:
            return 708            # CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE
        self.flags[dev.value] = flags
        return 0


def test_each_mode_sets_only_the_scheduling_bits_of_every_device(monkeypatch):
    # 0x8 (map host memory) is another flag: it must survive; 0x1 (spin) is replaced.
    for mode, bits in (("block", 0x4), ("yield", 0x2), ("spin", 0x1)):
        driver = FakeDriver([0x8 | 0x1, 0x0])
        monkeypatch.setattr(cuda_waits, "_driver", lambda: driver)
        assert cuda_waits.apply(mode) == mode
        assert driver.set_calls == [(0, 0x8 | bits), (1, bits)]
        assert cuda_waits.current(0) == mode and cuda_waits.current(1) == mode


def test_auto_leaves_the_driver_untouched(monkeypatch):
    def no_driver():
        raise AssertionError("auto must not load or initialise the driver")
    monkeypatch.setattr(cuda_waits, "_driver", no_driver)
    monkeypatch.delenv(cuda_waits.ENV, raising=False)
    assert cuda_waits.apply() == "auto (CUDA's default)"


def test_a_refusal_and_a_missing_driver_are_said_not_hidden(monkeypatch):
    driver = FakeDriver([0, 0], refuse={1})
    monkeypatch.setattr(cuda_waits, "_driver", lambda: driver)
    with pytest.raises(cuda_waits.CudaWaitRefused, match=r"block requested; refused by the "
                                                          r"driver on device\(s\) \[1\]"):
        cuda_waits.apply("block")
    assert driver.set_calls == [(0, 0x4), (1, 0x4)]     # every device tried first
    monkeypatch.setattr(cuda_waits, "_driver", lambda: None)
    assert cuda_waits.apply("block") == "block requested; no CUDA driver here"
    assert cuda_waits.current() is None


def test_an_unknown_mode_is_one_line_naming_it(monkeypatch, capsys):
    with pytest.raises(cuda_waits.CudaWaitError, match="'sometimes'"):
        cuda_waits.apply("sometimes")
    monkeypatch.setenv(cuda_waits.ENV, "sometimes")
    assert cli_main(["fuzz", "--impl", "sdpa", "--max-examples", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fuzzattn: error: FUZZATTN_CUDA_WAIT='sometimes' is not one of auto, spin, "
                   "yield, block"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_mode_holds_once_torch_has_created_the_context():
    script = ("from fuzzattn import settings; settings.choose_backend()\n"
              "import torch; torch.ones(4, device='cuda').sum().item()\n"
              "from fuzzattn.platform import cuda_waits; print(cuda_waits.current())\n")
    for mode in ("block", "yield"):
        env = dict(os.environ, **{cuda_waits.ENV: mode})
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == mode


def test_the_plugin_froze_the_long_lived_heap_once():
    # pytest_collection_finish (fuzzattn/pytest_plugin.py) froze what collection imported.
    assert heap._frozen
    frozen = gc.get_freeze_count()
    assert frozen > 10_000                    # torch, hypothesis, the test modules
    heap.freeze_long_lived()              # a campaign starting later: no second freeze
    assert gc.get_freeze_count() == frozen
    # and full passes over what came later are rarer than Python's default (one per 10)
    assert gc.get_threshold()[2] >= heap.FULL_PASS_AFTER > 10


def test_a_mode_the_driver_refuses_is_said_once_on_stderr(monkeypatch, capsys):
    driver = FakeDriver([0], refuse={0})
    monkeypatch.setattr(cuda_waits, "_driver", lambda: driver)
    monkeypatch.setenv(cuda_waits.ENV, "yield")
    from fuzzattn import settings
    settings.choose_backend()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fuzzattn: FUZZATTN_CUDA_WAIT: yield requested; refused by the driver on "
                   "device(s) [0]"]
