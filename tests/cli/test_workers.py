"""`--workers` (fuzzattn/cli/workers.py, merged.py), the shared example database
(fuzzattn/campaigns/example_db.py) and the gate's budget (fuzzattn/cli/gate.py).

Tiny budgets: the machine running the suite may have two cores, shared. No assertion here is
about speed; benchmarks/throughput.py --cli-workers measures that.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fuzzattn import cli
from fuzzattn.campaigns import example_db
from fuzzattn.campaigns.campaign import Campaign, Counterexample
from fuzzattn.campaigns.outcome import FAIL, OK, Outcome
from fuzzattn.campaigns.regression_file import Written
from fuzzattn.cli import gate, merged, workers
from fuzzattn.contract.case import AttentionCase
from fuzzattn.judgement.judge import JudgedCase
from fuzzattn.judging.verdict import Verdict

ROOT = Path(__file__).resolve().parents[2]
# A kernel that kills its process on some drawn cases (tests/isolation/test_watched.py's, as a file).
SEGFAULT_LATER = re.search(r"SEGFAULT_LATER = '''(.*?)'''",
                           (ROOT / "tests" / "isolation" / "test_watched.py").read_text(), re.S).group(1)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("FUZZATTN_REGRESSIONS_DIR", str(tmp_path / "default-regressions"))
    monkeypatch.delenv("FUZZATTN_DATABASE", raising=False)
    monkeypatch.delenv("CI", raising=False)


def run(capsys, *argv):
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def command(*args, cwd, env=None):
    """`python -m fuzzattn.cli ...` in its own working directory, as a user on a host runs it."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("PYTEST_XDIST", "FUZZATTN_SUPERVISED", "FUZZATTN_FLIGHT",
                                  "FUZZATTN_DATABASE", "FUZZATTN_REGRESSIONS_DIR"))
             and k != "PYTEST_CURRENT_TEST"}
    done = subprocess.run([sys.executable, "-m", "fuzzattn.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=600, env={**clean, **(env or {})})
    return done.returncode, done.stdout + done.stderr


def row(out: str, impl: str, dtype: str) -> list[str]:
    """The fuzz table's cells for one campaign (columns split by two or more spaces): its first
    line naming the campaign."""
    line = next(l for l in out.splitlines() if re.match(rf"{impl}\s+{dtype}\s", l))
    return re.split(r"\s{2,}", line.strip())


# -- the options ----------------------------------------------------------------------------------
@pytest.mark.parametrize("value, expected", [("0", "0 must be at least 1"),
                                             ("abc", "'abc' is not a whole number or auto"),
                                             ("-2", "-2 must be at least 1")])
@pytest.mark.parametrize("command_name", ["fuzz", "gate"])
def test_a_bad_worker_count_is_a_one_line_usage_error(capsys, command_name, value, expected):
    argv = [command_name, "--workers", value] + (["--impl", "sdpa"] if command_name == "fuzz" else [])
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("fuzzattn: error:") and expected in err, err


def test_each_worker_on_a_cuda_host_gets_its_share_of_the_cores(monkeypatch):
    from fuzzattn import settings
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(settings, "wants_one_thread", lambda: False)     # as with CUDA
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert [settings.threads_per_process(n) for n in (1, 4, 16, 32)] == [16, 4, 1, 1]
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert settings.threads_per_process(4) == 1
    monkeypatch.setattr(settings, "wants_one_thread", lambda: True)      # no CUDA: one each
    assert settings.threads_per_process(4) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")                           # the user's choice wins
    assert settings.threads_per_process(4) is None


def test_auto_is_one_worker_per_core_up_to_a_cap(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)    # a user's shell
    monkeypatch.setattr(workers, "visible_gpus", lambda: [])
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert workers.resolve_count("auto") == workers.CPU_CAP
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert workers.resolve_count("auto") == 2
    monkeypatch.setattr(workers, "visible_gpus", lambda: ["0", "3"])
    assert workers.resolve_count("auto") == 2                   # a GPU host: still one per core
    monkeypatch.setattr(os, "cpu_count", lambda: 256)
    assert workers.resolve_count("auto") == 2 * workers.PER_GPU
    assert workers.resolve_count(3) == 3
    # one of 16 pytest-xdist workers on 16 cores: its share, one core (in-process, no pool)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "16")
    assert workers.resolve_count("auto") == 1
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    assert workers.resolve_count("auto") == 4
    assert workers.resolve_count(3) == 3                        # asked for: given


@pytest.mark.parametrize("value, expected", [
    ("", "--database is empty"),
    ("http://example.org/db", "not a directory, a redis://host:port[/db] URL, or off"),
    ("redis://localhost:notaport", "the port is not a number"),
    ("redis://:6379", "no host"),
    ("redis://localhost:6379/zero", "the database number 'zero' is not a whole number"),
    ("FILE", "is not a directory"),
])
def test_a_bad_database_is_a_one_line_usage_error_naming_it(capsys, tmp_path, value, expected):
    if value == "FILE":
        value = str(tmp_path / "a-file")
        Path(value).write_text("not a directory")
    status, out, err = run(capsys, "fuzz", "--impl", "sdpa", "--dtype", "float32",
                           "--max-examples", 1, "--database", value)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and expected in err and "--database" in err, err


def test_the_database_from_the_environment_is_named_when_bad(capsys, monkeypatch):
    monkeypatch.setenv("FUZZATTN_DATABASE", "ftp://nowhere")
    status, _, err = run(capsys, "gate", "--allow-empty", "--budget", 1)
    assert status == 2 and "FUZZATTN_DATABASE 'ftp://nowhere'" in err, err


def test_redis_without_its_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)          # import redis raises ImportError
    with pytest.raises(example_db.DatabaseError, match=r"pip install 'hypothesis\[redis\]'"):
        example_db.open_database("redis://localhost:6379/0")


def test_the_default_database_sits_beside_the_regressions_directory(tmp_path):
    spec, source = example_db.choose(None, tmp_path / "regressions")
    assert (spec, source) == (str(tmp_path / ".fuzzattn" / "examples"), "default")
    assert example_db.choose("off", tmp_path)[0] == "off"
    assert example_db.open_database("off") is None
    assert example_db.key("sdpa", "float32", "dev") != example_db.key("sdpa", "float16", "dev")


# -- campaigns over workers ---------------------------------------------------------------------
def test_two_workers_judge_one_campaign_in_one_row(capsys, tmp_path):
    status, out, err = run(capsys, "fuzz", "--impl", "sdpa", "--dtype", "float32", "--profile", "dev",
                           "--max-examples", 6, "--workers", 2, "--regressions-dir", tmp_path / "reg")
    assert status == 0, out + err
    header = next(line for line in out.splitlines() if line.startswith("fuzzattn fuzz:"))
    assert "workers=2" in header, out          # (progress lines may come first on a slow start)
    cells = row(out, "sdpa", "float32")
    assert cells[2] == "ok" and int(cells[3]) == 6, cells      # 3 cases from each worker, summed
    assert not (tmp_path / "reg").exists()


SLOW_TO_LOAD = """
import time
import torch
import torch.nn.functional as F
time.sleep(6)                       # an outside kernel's import (a JIT build, say): in each worker
def attention(q, k, v, *, causal, scale):
    # fresh aligned copies: CUDA SDPA's backward faults on misaligned rows (kernels/sdpa_defects.py)
    q, k, v = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), scale=scale)
"""


@pytest.mark.parametrize("gpus", [[], ["0"]], ids=["fork-server", "spawned-as-on-a-cuda-host"])
def test_every_worker_is_up_before_a_campaigns_clock_starts(monkeypatch, gpus):
    """Each worker runs one start-up task and waits at the pool's barrier: a campaign's deadline
    is set only once every process has set itself up. (Spawned workers on a CUDA host take ~10 s
    to start; a share's deadline that passed during it judged no case.)"""
    monkeypatch.setattr(workers, "visible_gpus", lambda: gpus)
    with workers.Pool(2) as pool:
        pool.start()
        processes = set(pool._executor._processes)
        assert sorted(pool.ready_pids) == sorted(processes) and len(processes) == 2, pool.ready_pids


def test_a_workers_time_to_load_an_outside_kernel_is_not_its_share(capsys, tmp_path):
    """A share's clock starts once its worker has the implementation: a campaign of 4 s over
    workers that each import the kernel for 6 s still judges cases (it judged none when the
    import counted, and the gate left an outside kernel unfuzzed on a GPU host). A 1 s campaign
    still judged none under the H200 suite's load (2026-12-03): its margin is a few seconds."""
    (tmp_path / "slow.py").write_text(SLOW_TO_LOAD)
    status, out, err = run(capsys, "fuzz", "--impl", f"{tmp_path / 'slow.py'}:attention",
                           "--dtype", "float32", "--profile", "dev", "--max-examples", 1000,
                           "--seconds", 4, "--workers", 2, "--regressions-dir", tmp_path / "reg")
    assert status == 0, out + err
    cells = row(out, "attention", "float32")
    assert cells[2] == "ok" and int(cells[3]) > 0, cells


def test_a_bug_found_by_two_workers_is_listed_and_saved_once(capsys, tmp_path):
    # Almost every case fails (a query tile past the first is never written): both workers find
    # it and shrink it to the same case.
    status, out, err = run(capsys, "fuzz", "--impl", "mutant_tail_rows_unwritten", "--dtype",
                           "float32", "--profile", "dev", "--max-examples", 4, "--workers", 2,
                           "--database", "off", "--regressions-dir", tmp_path / "reg")
    assert status == 1, out + err
    files = sorted(p.name for p in (tmp_path / "reg").glob("*.json"))
    named = [Path(p).name for p in re.findall(r"regression file: (\S+\.json)", out)]
    assert files and len(named) == len(set(named)) and sorted(named) == files, (named, files)
    assert row(out, "mutant_tail_rows_unwritten", "float32")[2] == "FAIL"


def _judged(check: str, seq_q: int) -> JudgedCase:
    case = AttentionCase(1, 1, 1, seq_q, 2, 16)
    return JudgedCase("bad", case, [Verdict(impl="bad", case=case, check=check, passed=False,
                                            detail="wrong")], cli_name="bad")


def _part(judged, path, new=True, cases=5, first=2) -> Outcome:
    written = Written(Path(path), new)
    found = Counterexample(judged, written)
    campaign = Campaign(impl="bad", cases=cases, seconds=1.0, counterexample=found,
                        cases_to_first_failure=first)
    outcome = Outcome("fuzz", "bad float32", FAIL, False, cases, 1.0, detail="x",
                      message=f"{judged.describe()}\n  found by: fuzzattn fuzz --impl bad "
                              f"--hypothesis-seed {first}",
                      judged=judged)
    outcome.campaign = campaign
    return outcome


def test_merging_lists_the_same_shrunk_case_once_and_keeps_different_ones(tmp_path):
    same = [_part(_judged("out", 3), tmp_path / "a.json", first=4),
            _part(_judged("out", 3), tmp_path / "a.json", new=False, first=2)]
    outcome = merged.merge("fuzz", "bad float32", same, [], 2.0, max_examples=10, seconds=None)
    assert outcome.verdict == FAIL and outcome.cases == 10
    assert outcome.campaign.cases == 10 and outcome.campaign.cases_to_first_failure == 2
    assert outcome.message.count("regression file:") == 1 and outcome.message.count("found by:") == 1
    two = same[:1] + [_part(_judged("lse", 4), tmp_path / "b.json")]
    outcome = merged.merge("fuzz", "bad float32", two, [], 2.0, max_examples=10, seconds=None)
    assert "a.json" in outcome.message and "b.json" in outcome.message


def test_merging_tallies_one_defect_met_by_two_workers_and_keeps_one_file(tmp_path):
    from fuzzattn.campaigns.defects import Defect
    parts = []
    for name, new, hits in (("a.json", True, 3), ("b.json", True, 2)):
        (tmp_path / name).write_text("{}")
        part = _part(_judged("out", 3 if name == "a.json" else 4), tmp_path / name, new=new)
        part.campaign.defects = [Defect(counterexample=part.campaign.counterexample, check_key="out",
                                        keys=frozenset({"out"}), factors={"causal": "top_left"},
                                        hits=hits)]
        parts.append(part)
    outcome = merged.merge("fuzz", "bad float32", parts, [], 2.0, max_examples=10, seconds=None)
    [defect] = outcome.campaign.defects
    assert defect.hits == 5 and defect.counterexample.written.path == tmp_path / "a.json"
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["a.json"]    # b.json: the same defect
    assert "b.json" not in outcome.message and outcome.message.count("found by:") == 1
    assert "cases hit: 5" in outcome.message


def test_merging_passing_workers_reports_the_time_cap_once():
    parts = []
    for cases in (3, 4):
        o = Outcome("fuzz", "sdpa float32", OK, True, cases, 1.0, detail="time cap ...")
        o.campaign = Campaign(impl="sdpa", cases=cases, seconds=1.0, budget_hit=True,
                              refused={"RuntimeError: no": 1})
        parts.append(o)
    outcome = merged.merge("fuzz", "sdpa float32", parts, [], 1.5, max_examples=50, seconds=1.0)
    assert outcome.passed and outcome.cases == 7
    assert outcome.detail.startswith("time cap 1 s reached after 7 of 50 cases (2 workers)")
    assert outcome.ended == "time cap 1 s"
    assert "(2)" in outcome.detail                              # the refusals summed


def test_a_worker_that_dies_is_saved_as_a_segfault_and_shrunk_and_fuzz_goes_on(tmp_path):
    """The crashed campaign is an error row, the next implementation is still fuzzed, and the
    crash is saved and shrunk after the table."""
    (tmp_path / "odd.py").write_text(SEGFAULT_LATER)
    status, out = command("fuzz", "--impl", "odd.py:ODD_KEYS", "--impl", "sdpa", "--dtype", "float32",
                          "--max-examples", 40, "--workers", 2, "--database", "off",
                          "--regressions-dir", "reg", cwd=tmp_path)
    assert status == 1, out
    assert re.search(r"odd_keys\s+float32\s+error\s.*a worker process died", out), out
    assert row(out, "sdpa", "float32")[2] == "ok", out
    assert out.index("sdpa  ") < out.index("segfault: the process died"), out
    assert "segfault: the process died" in out and "odd.py:8 in attention" in out, out
    records = [json.loads(p.read_text()) for p in (tmp_path / "reg").glob("*.json")]
    assert records and {r["check"] for r in records} == {"segfault"}, out
    for record in records:          # the kernel fails exactly on these cases, shrunk
        assert (record["case"]["seq_q"], record["case"]["seq_k"] % 2) == (3, 1), record


# -- two hosts, one database ----------------------------------------------------------------------
def test_a_failure_found_on_one_host_is_judged_first_on_another(tmp_path):
    shared = tmp_path / "shared-examples"
    argv = ["fuzz", "--impl", "mutant_mqa_squeeze", "--dtype", "float32", "--profile", "dev",
            "--max-examples", 20, "--database", shared]
    hosts = [tmp_path / "host-a", tmp_path / "host-b"]
    for host in hosts:
        host.mkdir()
    # Host A finds it (seed 1 draws it at its 10th case) and shrinks it into the database.
    status, out_a = command(*argv, "--hypothesis-seed", 1, cwd=hosts[0],
                            env={"FUZZATTN_SUPERVISE": "off"})
    assert status == 1, out_a
    found_a = row(out_a, "mutant_mqa_squeeze", "float32")
    # Host B, another seed (which alone first fails at its 7th case), judges A's case first.
    status, out_b = command(*argv, "--hypothesis-seed", 2, cwd=hosts[1],
                            env={"FUZZATTN_SUPERVISE": "off"})
    assert status == 1, out_b
    found_b = row(out_b, "mutant_mqa_squeeze", "float32")
    assert found_b[6] == "1", found_b                          # first failure at: case 1
    assert found_b[-1] in out_a, (found_a, found_b)            # a case A found and saved
    assert list((hosts[1] / "regressions").glob("*.json")), "B saves its own regression file"


# -- the gate's budget ----------------------------------------------------------------------------
def test_the_gate_shares_its_budget_out_and_passes_on_what_is_left(capsys, monkeypatch, tmp_path):
    given = []

    used = 0.05

    def campaign(pool, impl, dtype, *, seconds, **kw):
        given.append(seconds)
        time.sleep(used)                       # less than its share: the rest goes to later ones
        return Outcome("fuzz", f"{impl.name} {dtype}", OK, True, 1, used)

    monkeypatch.setattr(gate.workers, "run_campaign", campaign)
    status, out, err = run(capsys, "gate", "--budget", 40, "--allow-empty", "--workers", 1,
                           "--regressions-dir", tmp_path / "none")
    assert status == 0, out + err
    assert "budget=40 s for replay and fuzzing" in out
    assert len(given) >= 3 and all(s > 0 for s in given), out
    # each offer is a share of what is left: what earlier campaigns used plus the last offer
    # (all that was left) stays within the budget
    assert used * (len(given) - 1) + given[-1] <= 40, given
    assert given == sorted(given), given                       # unused time flows onward


def test_the_gate_fuzzes_interpreted_triton_kernels_last():
    """They use every second they get; the others leave most of their share to them."""
    from fuzzattn.contract import Capabilities, Implementation
    tri = Implementation("tri", lambda *a, **k: None, Capabilities(), backend="triton")
    tor = Implementation("tor", lambda *a, **k: None, Capabilities())
    plan = [(tri, "float32"), (tor, "float32"), (tri, "bfloat16"), (tor, "bfloat16")]
    assert [(i.name, d) for i, d in gate.fuzz_order(plan, interpreted=True)] == [
        ("tor", "float32"), ("tor", "bfloat16"), ("tri", "float32"), ("tri", "bfloat16")]
    assert gate.fuzz_order(plan, interpreted=False) == plan


def test_the_gate_fuzzes_per_shape_compilers_last():
    """Their first cases compile for longer than an equal share: they get what the others left."""
    from fuzzattn.contract import Capabilities, Implementation
    tri = Implementation("tri", lambda *a, **k: None, Capabilities(), backend="triton")
    tor = Implementation("tor", lambda *a, **k: None, Capabilities())
    flex = Implementation("flex", lambda *a, **k: None, Capabilities(compiles_per_shape=True))
    plan = [(tri, "float32"), (flex, "float32"), (tor, "float32"), (flex, "float16")]
    assert [(i.name, d) for i, d in gate.fuzz_order(plan, interpreted=False)] == [
        ("tri", "float32"), ("tor", "float32"), ("flex", "float32"), ("flex", "float16")]
    assert [i.name for i, _ in gate.fuzz_order(plan, interpreted=True)] == ["tor", "tri", "flex", "flex"]
    order = [i.name for i, _ in gate.fuzz_order(plan, interpreted=False, outside=frozenset({"flex"}))]
    assert order == ["flex", "flex", "tri", "tor"]


def test_a_per_shape_compiler_is_not_started_on_a_share_shorter_than_its_compiles(
        capsys, monkeypatch, tmp_path):
    from fuzzattn.cli import common
    from fuzzattn.contract import Capabilities, Implementation
    compiling = Implementation("compiling", lambda *a, **k: None,
                               Capabilities(dtypes={"float32"}, compiles_per_shape=True))
    plain = Implementation("plain", lambda *a, **k: None, Capabilities(dtypes={"float32"}))
    monkeypatch.setattr(common, "registered", lambda: [compiling, plain])
    started = []

    def campaign(pool, impl, dtype, *, seconds, **kw):
        started.append(impl.name)
        return Outcome("fuzz", f"{impl.name} {dtype}", OK, True, 1, 0.01)

    monkeypatch.setattr(gate.workers, "run_campaign", campaign)
    args = ("gate", "--allow-empty", "--workers", 1, "--regressions-dir", tmp_path / "none")
    status, out, err = run(capsys, *args, "--budget", gate.FIRST_COMPILES / 2)
    assert status == 0, out + err
    assert started == ["plain"], out
    assert re.search(r"compiling float32 +skip .*not fuzzed: its \d+ s share is shorter than its "
                     r"first compiles", out), out
    started.clear()
    status, out, err = run(capsys, *args, "--budget", gate.FIRST_COMPILES * 2)
    assert status == 0 and started == ["plain", "compiling"], out + err


def test_the_gate_with_a_small_budget_ends_and_reports_every_campaign(capsys, tmp_path):
    status, out, err = run(capsys, "gate", "--budget", 6, "--allow-empty", "--workers", 1,
                           "--profile", "dev", "--regressions-dir", tmp_path / "none")
    assert status == 0, out + err
    assert "budget=6 s for replay and fuzzing" in out and "gate: fuzzing" in out
    assert re.search(r"gate passed: \d+ passed, 0 failed", out), out
    assert "fuzz   sdpa float32" in out, out


def test_an_unusable_default_database_falls_back_and_says_where_a_chosen_one_is_an_error(
        tmp_path, capsys, monkeypatch):
    """The default sits beside the regressions directory, which may be unwritable (that falls
    back too); a directory the user named is theirs to fix."""
    import tempfile
    from fuzzattn.campaigns import example_db
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    database = example_db.open_database(str(blocker / "examples"), "default")
    assert str(database.path) == str(tmp_path / "tmp" / example_db.FALLBACK_DIR)
    assert "cannot create the directory" in capsys.readouterr().err
    with pytest.raises(example_db.DatabaseError, match="cannot create the directory"):
        example_db.open_database(str(blocker / "examples"), "--database")


# -- replay over the workers ------------------------------------------------------------------------
# Small fp32 D=16 cases with a configuration: none is FlexAttention's (compiling one kernel per
# shape, minutes on a GPU host), and two fail on a kernel that dies when Nq >= 3 and Nk is odd.
CONFIGURED = ("065944617799", "79368643515d", "e8f8cbe29ab9")
PLAIN = ("5982e80801ec", "51041f3c8d79", "b4510e89ddd8")      # Nq, Nk: 17, 1; 2, 17; 1, 1


def _replay_rows(out: str, first: str = "replay  ") -> list[list[str]]:
    """A table's rows (those starting with `first`) without their seconds."""
    rows = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line.startswith(first)]
    return [[cell for cell in cells if not re.fullmatch(r"\d+\.\d", cell)] for cells in rows]


def _regressions(tmp_path, names) -> Path:
    directory = tmp_path / "reg"
    directory.mkdir()
    for name in names:
        (directory / f"{name}.json").write_text((ROOT / "regressions" / f"{name}.json").read_text())
    (directory / "broken.json").write_text('{"bad": 1}')
    return directory


def test_the_gate_replays_over_its_workers_with_the_rows_of_one_process(capsys, monkeypatch,
                                                                       tmp_path):
    from fuzzattn.cli import gate
    monkeypatch.setattr(gate, "REPLAY_SHARE", float("inf"))     # every file, then no fuzzing
    directory = _regressions(tmp_path, CONFIGURED)
    rows = {}
    for n in (1, 2):
        status, out, err = run(capsys, "gate", "--workers", n, "--budget", 0.5, "--database", "off",
                               "--regressions-dir", directory, "-v")     # every row, clean ones too
        assert status == 1, out + err                               # broken.json fails
        assert f"{n} worker(s)" in out and "budget was spent" in out, out
        rows[n] = _replay_rows(out)
    assert len(rows[1]) > len(CONFIGURED), rows[1]
    assert rows[2] == rows[1]
    # in the order replayed, smallest case first and a file that does not load before all
    assert ["replay", "broken.json", "FAIL"] == rows[2][0][:3], rows[2]


@pytest.mark.parametrize("n", [1, 2])
def test_a_watched_replay_gives_a_crash_its_row_and_writes_no_file(tmp_path, n):
    """As a user runs it (watched): a file that now crashes its kernel is a failing row of the
    whole table, every other file replayed. Nothing is saved: the crash's case is a file already,
    and a copy in the default directory would be replayed as another defect. Over two processes
    the files of the worker that died are replayed again, each in an isolated worker of the
    command itself; over one, the crash ends the command's own process, and the replay runs
    again, every file isolated."""
    directory = _regressions(tmp_path, PLAIN)
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    (tmp_path / "odd.py").write_text(SEGFAULT_LATER)
    status, out = command("replay", directory, "--impl", "odd.py:ODD_KEYS", "--workers", n,
                          cwd=tmp_path, env={"FUZZATTN_REGRESSIONS_DIR": str(tmp_path / "default")})
    assert status == 1, out
    rows = _replay_rows(out, first=tuple(f"{name}.json " for name in PLAIN) + ("broken.json ",))
    assert [cells[:4] for cells in rows] == [
        ["51041f3c8d79.json", "odd_keys", "ok"], ["5982e80801ec.json", "odd_keys", "FAIL", "segfault"],
        ["b4510e89ddd8.json", "odd_keys", "ok"], ["broken.json", "-", "FAIL", "malformed"]], out
    assert "worker died with SIGSEGV at odd.py:8 in attention" in out, out
    assert ("fuzzattn: replay again, isolated" in out) == (n == 1), out
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before
    assert not (tmp_path / "default").exists() and not (tmp_path / "regressions").exists(), out


def test_a_replay_over_workers_stopped_reports_the_files_it_finished(capsys, monkeypatch, tmp_path):
    """SIGTERM (a CI step's timeout) while files 2 and 3 of 4 are still out: the two that came
    back are printed, in the files' order."""
    directory = _regressions(tmp_path, CONFIGURED)

    def each(self, function, tasks, status, results, deadline=None):
        for i in (3, 0):                    # 065944617799, 79368643515d, broken.json, e8f8cbe29ab9
            results[i] = function(tasks[i])
        raise cli.common.Terminated()

    monkeypatch.setattr(workers.Pool, "each", each)
    status, out, _ = run(capsys, "replay", directory, "--impl", "triton_fa2", "--workers", 2)
    assert status == 143, out
    assert re.search(r"stopped by SIGTERM after 2 of 4 regression file\(s\): 2 passed", out), out
    assert [cells[0] for cells in _replay_rows(out, first=CONFIGURED)] == [
        f"{CONFIGURED[0]}.json", f"{CONFIGURED[2]}.json"]      # broken.json was still out


def test_a_replay_over_workers_sends_isolated_files_first_and_reports_in_the_files_order(
        capsys, monkeypatch, tmp_path):
    """A file judged in an isolated worker starts a process of its own: sent last, it was the
    replay's tail. The table keeps the files' order."""
    directory = _regressions(tmp_path, CONFIGURED)
    hang = directory / f"{CONFIGURED[2]}.json"          # the last file by name records a hang
    hang.write_text(json.dumps({**json.loads(hang.read_text()), "check": "hang"}))
    submitted = []

    def each(self, function, tasks, status, results, deadline=None):
        for i, task in enumerate(tasks):
            submitted.append(Path(task.path).name)
            results[i] = [Outcome("replay", f"{submitted[-1]} on triton_fa2", OK, True)]

    monkeypatch.setattr(workers.Pool, "each", each)
    status, out, _ = run(capsys, "replay", directory, "--impl", "triton_fa2", "--workers", 2)
    assert submitted[0] == hang.name and len(submitted) == 4, submitted
    names = sorted(p.name for p in directory.glob("*.json"))
    assert [cells[0] for cells in _replay_rows(out, first=tuple(names))] == names, out
