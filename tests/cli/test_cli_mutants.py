"""`fuzzattn mutants`: killed, survived and the score; a failing case's configuration; one
campaign per dtype; an empty zoo; a seeded bug kept outside the repository."""
from __future__ import annotations

import pytest
import torch

from fuzzattn import cli
from fuzzattn.contract import Capabilities, Implementation

from purpose_built import DROP_LAST_KEY_SOURCE


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("FUZZATTN_REGRESSIONS_DIR", str(tmp_path / "default-fixtures"))
    monkeypatch.delenv("CI", raising=False)


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("outside") / "broken.py"
    path.write_text(DROP_LAST_KEY_SOURCE)
    return str(path)


def run(capsys, *argv):
    status = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# -- mutants ------------------------------------------------------------------------------------
def _zoo(broken_path: str) -> dict:
    from fuzzattn.run.loader import load_implementation
    from fuzzattn.kernels.sdpa import sdpa_forward
    caps = Capabilities(dtypes={"float32"})
    killed = load_implementation(f"{broken_path}:drop_last_key")
    return {
        "mutant_drop_last_key": Implementation(name="mutant_drop_last_key", fn=killed.fn, caps=caps,
                                               description="ignores the last key", mutant_of="sdpa"),
        "mutant_harmless": Implementation(name="mutant_harmless", fn=sdpa_forward, caps=caps,
                                          description="changes nothing", mutant_of="sdpa"),
    }


def test_mutants_reports_killed_survived_and_score(capsys, monkeypatch, broken, tmp_path):
    import fuzzattn.run.registry
    monkeypatch.setattr(fuzzattn.run.registry, "mutants", lambda: _zoo(broken))
    status, out, _ = run(capsys, "mutants", "--list")
    assert status == 0 and "ignores the last key" in out and "mutant_harmless" in out
    status, out, _ = run(capsys, "mutants", "--max-examples", 8)
    assert status == 1                                      # one survives
    assert "killed" in out and "SURVIVED" in out and "mutation score: 1/2" in out
    status, out, _ = run(capsys, "mutants", "--only", "mutant_drop_last_key", "--max-examples", 8)
    assert status == 0 and "mutation score: 1/1" in out
    assert not (tmp_path / "default-fixtures").exists()    # mutants never leave fixtures


def _wide_tiles_bug(q, k, v, *, causal, scale, config):
    from fuzzattn.kernels.sdpa import sdpa_forward
    out, lse = sdpa_forward(q, k, v, causal=causal, scale=scale)
    return (out * 2 if config["BLOCK_N"] == 64 else out), lse


def test_mutants_print_the_configuration_of_each_failing_case(capsys, monkeypatch):
    """The table cuts the failing case at its width; the configuration a configuration-only bug
    was caught under is printed in full below it."""
    import fuzzattn.run.registry
    caps = Capabilities(dtypes={"float32"}, configs={"BLOCK_M": (16, 32), "BLOCK_N": (16, 64)})
    zoo = {"mutant_wide_tiles": Implementation(
        name="mutant_wide_tiles", fn=_wide_tiles_bug, caps=caps, mutant_of="sdpa",
        description="doubles the output when BLOCK_N is 64")}
    monkeypatch.setattr(fuzzattn.run.registry, "mutants", lambda: zoo)
    status, out, _ = run(capsys, "mutants", "--max-examples", 20)
    assert status == 0 and "configuration of each failing case:" in out, out
    line = next(x for x in out.splitlines() if x.startswith("  mutant_wide_tiles: "))
    assert "BLOCK_N=64" in line and "BLOCK_M=" in line, line


def _fp16_only_bug(q, k, v, *, causal, scale):
    from fuzzattn.kernels.sdpa import sdpa_forward
    out, lse = sdpa_forward(q, k, v, causal=causal, scale=scale)
    return (out * 2 if q.dtype == torch.float16 else out), lse


def test_mutants_runs_one_campaign_per_dtype(capsys, monkeypatch):
    """A bug planted for one dtype is caught in that dtype's campaign, with the full budget there,
    after the earlier dtypes' campaigns found nothing; the table names the dtype."""
    import fuzzattn.run.registry
    caps = Capabilities(dtypes={"float32", "float16"})
    zoo = {"mutant_fp16_only": Implementation(name="mutant_fp16_only", fn=_fp16_only_bug, caps=caps,
                                              description="doubles fp16 outputs", mutant_of="sdpa")}
    monkeypatch.setattr(fuzzattn.run.registry, "mutants", lambda: zoo)
    status, out, _ = run(capsys, "mutants", "--max-examples", 5)
    assert status == 0 and "per dtype campaign" in out, out
    row = next(line for line in out.splitlines() if line.startswith("mutant_fp16_only"))
    assert "killed" in row and "float16" in row and "out" in row, row
    status, out, _ = run(capsys, "mutants", "--max-examples", 5, "--dtype", "float32")
    assert status == 1 and "no failure in float32 5 cases" in out, out


def test_mutants_seconds_is_shared_by_a_mutants_dtype_campaigns(capsys, monkeypatch):
    """--seconds caps the mutant, not each dtype campaign: an fp32 campaign with a case budget
    it cannot spend in time stops at its share, and the fp16 campaign still runs and kills."""
    import time
    import fuzzattn.run.registry
    from fuzzattn.cli import mutants

    def slow_fp16_only_bug(q, k, v, **kw):
        time.sleep(0.05)
        return _fp16_only_bug(q, k, v, **kw)
    caps = Capabilities(dtypes={"float32", "float16"})
    zoo = {"mutant_fp16_only": Implementation(name="mutant_fp16_only", fn=slow_fp16_only_bug,
                                              caps=caps, description="doubles fp16 outputs",
                                              mutant_of="sdpa")}
    monkeypatch.setattr(fuzzattn.run.registry, "mutants", lambda: zoo)
    shares = []
    real = mutants.common.campaign_outcome
    monkeypatch.setattr(mutants.common, "campaign_outcome",
                        lambda *a, seconds, **kw: shares.append(seconds) or real(*a, seconds=seconds, **kw))
    status, out, _ = run(capsys, "mutants", "--max-examples", 100000, "--seconds", 4)
    assert status == 0 and "seconds=4 per mutant" in out, out
    row = next(line for line in out.splitlines() if line.startswith("mutant_fp16_only"))
    assert "killed" in row and "float16" in row, row
    assert len(shares) == 2 and shares[0] == pytest.approx(2.0, abs=0.1)   # half each, in turn
    assert 0 < shares[1] < 2.1, shares                      # what the fp32 campaign left


def test_mutants_with_an_empty_zoo(capsys, monkeypatch):
    import fuzzattn.run.registry
    monkeypatch.setattr(fuzzattn.run.registry, "mutants", lambda: {})
    status, out, _ = run(capsys, "mutants")
    assert status == 0 and "no mutants" in out


def test_mutants_runs_an_outside_seeded_bug(capsys, broken):
    status, out, _ = run(capsys, "mutants", "--impl", f"{broken}:drop_last_key", "--max-examples", "20")
    assert status == 0, out
    assert "drop_last_key" in out and "killed" in out and "1/1 killed" in out
