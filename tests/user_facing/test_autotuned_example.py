"""The second real-shaped example, examples/autotuned_causal_attention.py: a wide autotuned
configuration list (some entries do not compile for small head dims), causal staging, and three
independent seeded defects, each shown here on its own case and absent from its neighbour."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fuzzattn import AttentionCase
from fuzzattn.judgement.judge import judge
from fuzzattn.run.loader import load_implementation

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "autotuned_causal_attention.py"
SPEC = f"{EXAMPLE}:AUTOTUNED_CAUSAL"


@pytest.fixture(scope="module")
def impl():
    from fuzzattn import settings
    settings.choose_backend()          # the interpreter's bf16 repairs, as the CLI installs them
    return load_implementation(SPEC)


def _config(block_m: int, block_n: int) -> tuple:
    return (("BLOCK_M", block_m), ("BLOCK_N", block_n), ("num_stages", 1), ("num_warps", 4))


def _case(seq_q, seq_k, head_dim=16, *, m=16, n=16, **kw) -> AttentionCase:
    return AttentionCase(1, 1, 1, seq_q, seq_k, head_dim, dtype=kw.pop("dtype", "float16"),
                         config=_config(m, n), **kw)


def test_the_declaration_is_the_autotuners_list(impl):
    caps = impl.caps
    assert dict(caps.configs) == {"BLOCK_M": (16, 32, 64), "BLOCK_N": (16, 32, 64),
                                  "num_stages": (1, 2), "num_warps": (4, 8)}
    assert caps.dtypes == {"float16", "bfloat16"} and caps.causal == ("top_left",)


@pytest.mark.parametrize("case", [
    _case(37, 50, 32, m=16, n=32, causal="top_left"),
    _case(20, 70, 16, m=64, n=16, dtype="bfloat16"),
    _case(32, 32, m=16, n=16, causal="top_left"),      # BLOCK_M == BLOCK_N: the diagonal is whole
    _case(4, 4, values="large"),                       # scores near +-1e4: the sentinel is below
], ids=["causal", "bf16_ragged", "square_tiles", "large_values"])
def test_outside_the_seeded_triggers_it_is_right(impl, case):
    judged = judge(impl, case)
    assert judged.passed, judged.describe()


@pytest.mark.parametrize("case, check", [
    # 1: causal, BLOCK_M > BLOCK_N: the tile's last rows miss their nearest keys
    (_case(32, 32, m=32, n=16, causal="top_left"), "out"),
    # 2: every score of a row below -1e6: the running max started there, exp underflows
    (_case(3, 3, values="below_sentinel"), "nonfinite"),
    # 3: Nq > Nk: lse rows at or past Nk are never written
    (_case(5, 3), "unwritten_output"),
], ids=["diagonal", "finite_max", "lse_rows"])
def test_each_seeded_defect_shows_on_its_own_trigger(impl, case, check):
    judged = judge(impl, case)
    assert not judged.passed and judged.first_failure.check == check, judged.describe()


def _keeps_going() -> bool:
    """Whether `fuzzattn fuzz` goes on after a counterexample (it has --stop-at-first then)."""
    from fuzzattn.cli import common
    return hasattr(common, "stop_option")


def _which_defect(case: dict) -> str:
    """The seeded defect whose trigger a shrunk case holds; a case holding none, or several, is
    no evidence for one defect."""
    config = dict(case.get("config") or [])
    triggers = {
        "diagonal": case.get("causal") == "top_left" and config.get("BLOCK_M", 0) > config.get("BLOCK_N", 0),
        "finite_max": case.get("values") in ("below_sentinel", "sentinel_sweep"),
        "lse_rows": case["seq_q"] > case["seq_k"],
    }
    held = [name for name, holds in triggers.items() if holds]
    return held[0] if len(held) == 1 else f"ambiguous {held}: {case}"


@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    """One `fuzzattn fuzz` run on the example: its exit status, output and shrunk defects."""
    import contextlib
    import io
    from fuzzattn import cli
    saved = tmp_path_factory.mktemp("regressions")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(["fuzz", "--impl", SPEC, "--dtype", "float16", "--max-examples", "300",
                           "--profile", "dev", "--hypothesis-seed", "0", "--regressions-dir", str(saved)])
    found = sorted(_which_defect(json.loads(p.read_text())["case"]) for p in saved.glob("*.json"))
    return status, out.getvalue(), found


KEEP_GOING = pytest.mark.skipif(not _keeps_going(), reason="fuzz stops at its first counterexample here")


@KEEP_GOING
def test_one_fuzz_run_reports_every_seeded_defect_once(one_run):
    """One test over the run (not one per claim): under xdist each test holding the module's
    fixture would pay the whole fuzz run again in its own worker, 150 s compiled on the H200."""
    status, out, found = one_run
    assert status == 1, out
    assert found == ["diagonal", "finite_max", "lse_rows"], out
