"""benchmarks/gpu_campaign.py and gpu_report.py on the CPU with tiny budgets (profile ci): two
runs are two shards with distinct Hypothesis seeds, a failure is recorded with its file and the
expected-failure file that covers it, and the report sums both runs."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from fuzzattn.campaigns.regression_file import ExpectedFailure, RegressionFile, write
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.profiles import PROFILES
from fuzzattn.run import registry
from fuzzattn.settings import device_description
from fuzzattn.judge.judge import default_device

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "tests" / "purpose_built.py"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two tiny runs into one --out: a real implementation and one that fails on bottom-right.
    The tests using it stand together below it: under `--dist worksteal` a test of it stolen by
    the other worker sets it up there again (8.5 s, seen in the durations)."""
    campaign = _script("gpu_campaign")
    out = tmp_path_factory.mktemp("gpu_results")
    known = tmp_path_factory.mktemp("known")
    # an expected-failure file for the broken implementation: same dtype, alignment, config
    case = AttentionCase(1, 1, 1, 2, 5, 16, causal="bottom_right")
    write(RegressionFile(case=case, expected_failures={"bottom_right_as_top_left": ExpectedFailure(
        "planted", device=default_device())}), known)
    argv = ["--seconds", "4", "--profile", "ci", "--out", str(out), "--known-regressions", str(known),
            "--impl", "sdpa_math", "--impl", f"{BUILT}:BOTTOM_RIGHT_AS_TOP_LEFT", "--dtype", "float32"]
    # main() loads the ci profile (Hypothesis settings and FUZZATTN_PROFILE) as the script must;
    # put back what this test process had, as the CLI's main does
    from fuzzattn.cli import _profile_restored
    with _profile_restored():
        assert campaign.main(argv) == 0
        assert campaign.main(argv) == 0
    results = sorted(out.glob("gpu_campaign_*.json"), key=lambda p: json.loads(p.read_text())["shard"])
    return out, [json.loads(p.read_text()) for p in results]


def test_each_run_writes_one_result_with_what_the_report_needs(two_runs):
    out, results = two_runs
    assert len(results) == 2
    for result in results:
        assert result["date"] and result["profile"] == "ci"
        assert result["device"] == device_description()        # "cpu", or the GPU's name
        assert {"torch", "triton", "hypothesis", "fuzzattn"} <= set(result["versions"])
        by_impl = {c["impl"]: c for c in result["campaigns"]}
        assert set(by_impl) == {"sdpa_math", "bottom_right_as_top_left"}
        for c in result["campaigns"]:
            # a slot of 2 s may judge no case at all on a loaded machine: the count is what it is
            assert c["dtype"] == "float32" and c["cases"] >= 0 and c["seconds"] > 0
            assert c["cases_per_s"] == pytest.approx(c["cases"] / c["seconds"], rel=1e-2)
            assert isinstance(c["refused"], dict)
        assert by_impl["sdpa_math"]["failures"] == []


def test_runs_are_shards_with_distinct_seeds(two_runs):
    _, results = two_runs
    assert [r["shard"] for r in results] == [0, 1]
    seeds = [set(s for c in r["campaigns"] for s in c["hypothesis_seeds"]) for r in results]
    assert seeds[0] and seeds[1] and not seeds[0] & seeds[1]


def test_a_failure_names_its_file_and_the_expected_failure_covering_it(two_runs):
    out, results = two_runs
    failures = [f for r in results for c in r["campaigns"] for f in c["failures"]]
    assert failures, "the bottom-right bug was not found"
    for f in failures:
        assert f["case"]["causal"] == "bottom_right" and f["check"]
        assert Path(f["file"]).is_file() and Path(f["file"]).parent == out / "regressions"
        assert len(f["covered_by"]) == 1


def test_the_report_sums_the_runs(two_runs, tmp_path):
    out, results = two_runs
    report = _script("gpu_report")
    target = tmp_path / "GPU_REPORT.md"
    assert report.main([str(out), "--out", str(target)]) == 0
    text = target.read_text()
    assert "runs: 2 (shards 0, 1)" in text and "torch 2" in text
    total = sum(c["cases"] for r in results for c in r["campaigns"] if c["impl"] == "sdpa_math")
    (row,) = [line for line in text.splitlines() if line.startswith("| sdpa_math | float32 |")]
    assert row.split("|")[3].strip() == str(total)
    assert ("| judge error fixed | upstream defect (expected-failure file) | kernel bug fixed |"
            in text)
    assert "bottom_right_as_top_left" in text.split("## Findings")[1]


def test_the_scaling_summary_sums_the_runs_of_a_directory(two_runs):
    out, runs = two_runs
    cases = sum(c["cases"] for r in runs for c in r["campaigns"])
    line = _script("scaling_summary").summary(out, 2, "two_runs")
    assert f"{len(runs):2d} results, {cases:6d} cases" in line and cases > 0
    assert line.endswith("GPU sm% median -1")        # no dmon samples on the CPU


def test_the_report_refuses_what_is_not_a_result(tmp_path):
    report = _script("gpu_report")
    (tmp_path / "gpu_campaign_x.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a gpu_campaign result"):
        report.main([str(tmp_path), "--out", str(tmp_path / "r.md")])


def test_parts_split_the_plan_and_isolated_runs_record_how_they_judged(tmp_path):
    """--part I/N takes every Nth campaign of the plan; --isolate judges in a worker process and
    --gradient-every is recorded, so the report can say how the cases were judged."""
    campaign = _script("gpu_campaign")
    from fuzzattn.cli import _profile_restored
    base = ["--seconds", "3", "--profile", "ci", "--impl", "sdpa_math", "--impl", "torch_tiled",
            "--dtype", "float32"]
    with _profile_restored():
        assert campaign.main(base + ["--out", str(tmp_path / "a"), "--part", "1/2"]) == 0
        assert campaign.main(base + ["--out", str(tmp_path / "b"), "--impl", "sdpa_math",
                                     "--isolate", "--gradient-every", "3"]) == 0
        with pytest.raises(SystemExit):
            campaign.main(base + ["--out", str(tmp_path / "c"), "--part", "2/2"])
    (a,) = [json.loads(p.read_text()) for p in (tmp_path / "a").glob("gpu_campaign_*.json")]
    assert [c["impl"] for c in a["campaigns"]] == ["torch_tiled"]
    (b,) = [json.loads(p.read_text()) for p in (tmp_path / "b").glob("gpu_campaign_*.json")]
    assert b["isolated"] is True and b["gradient_every"] == 3
    assert all(c["isolation"] == {"hangs": 0, "device_faults": 0} for c in b["campaigns"])


def test_warm_up_cases_are_judged_before_the_clock_and_counted_nowhere(tmp_path, monkeypatch):
    """--warm-up N judges N cases of each campaign (gradients on every one, nothing saved) before
    its clock starts: the campaign counts only its own cases, and the wait mode is recorded
    (None without a GPU)."""
    campaign = _script("gpu_campaign")
    import fuzzattn.campaigns.campaign as campaigns
    calls, real = [], campaigns.fuzz

    def recorded(impl, strategy, **kw):
        result = real(impl, strategy, **kw)
        calls.append((kw, result.cases))
        return result

    monkeypatch.setattr(campaigns, "fuzz", recorded)
    from fuzzattn.cli import _profile_restored
    with _profile_restored():
        assert campaign.main(["--seconds", "2", "--profile", "ci", "--impl", "sdpa_math",
                              "--dtype", "float32", "--out", str(tmp_path), "--warm-up", "4",
                              "--gradient-every", "4"]) == 0
    (result,) = [json.loads(p.read_text()) for p in tmp_path.glob("gpu_campaign_*.json")]
    (entry,) = result["campaigns"]
    (warm, warm_cases), *timed = calls
    assert warm["max_examples"] == 4 and warm["gradient_every"] == 1 and warm_cases == 4
    assert warm.get("seconds") is None and not warm["save_to_file"]
    assert warm["hypothesis_seed_value"] not in entry["hypothesis_seeds"]
    assert timed and all(kw["seconds"] is not None for kw, _ in timed)
    assert entry["cases"] == sum(cases for _, cases in timed)
    assert "cuda_waits" in result and (result["cuda_waits"] is None) == (not torch.cuda.is_available())


def test_more_parts_than_campaigns_wrap_around(tmp_path):
    campaign = _script("gpu_campaign")
    from fuzzattn.cli import _profile_restored
    with _profile_restored():
        assert campaign.main(["--seconds", "1", "--profile", "ci", "--impl", "sdpa_math",
                              "--dtype", "float32", "--out", str(tmp_path), "--part", "3/5",
                              "--shard", "7"]) == 0
    (result,) = [json.loads(p.read_text()) for p in tmp_path.glob("gpu_campaign_*.json")]
    assert result["shard"] == 7 and [c["impl"] for c in result["campaigns"]] == ["sdpa_math"]


def test_triage_judges_each_file_per_implementation_forward_and_with_gradients(capsys):
    """benchmarks/gpu_triage.py on the CPU: one line per (file, implementation) with the forward's
    verdict and the verdict with gradients, each implementation in its own worker process; a
    file's configuration that belongs to another implementation is dropped, not refused."""
    triage = _script("gpu_triage")
    files = [str(ROOT / "regressions" / "fcde2197009b.json"),        # configless
             str(ROOT / "regressions" / "016e68cd71a9.json")]        # config of sdpa_math
    from fuzzattn.cli import _profile_restored
    with _profile_restored():
        assert triage.main(files + ["--impl", "sdpa_math", "--impl", "torch_tiled",
                                    "--impl", "no_such_impl"]) == 0
    lines = capsys.readouterr().out.splitlines()
    judged = [line for line in lines if "forward:" in line]
    assert len(judged) == 4, lines
    assert all("forward: ok" in line and line.rstrip().endswith("with gradients: ok")
               for line in judged), judged
    assert "no_such_impl: not a registered implementation" in lines


@pytest.mark.parametrize("script", sorted((ROOT / "benchmarks").glob("gpu_*.sh")), ids=lambda p: p.name)
def test_each_gpu_call_script_parses_and_shares_the_preamble(script):
    """A GPU call is minutes of device time: a script that does not parse, or that lost the
    shared preamble (output folder, install, scale_run), must fail here, not on the device."""
    import subprocess
    parsed = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr
    if script.name != "gpu_common.sh":
        assert 'source "$(dirname "$0")/gpu_common.sh"' in script.read_text()


def test_probe_rows_prints_the_kernels_and_the_oracles_rows_for_each_variant(capsys):
    """benchmarks/probe_rows.py, on a finding file with a configuration: the recorded case, a
    configuration change and a field change each print rows of lse and out beside the oracle's;
    a variant the implementation refuses says so in a line and the others still run."""
    probe = _script("probe_rows")
    finding = ROOT / "regressions" / "31366c6d544e.json"
    assert probe.main([str(finding), "--vary", "BLOCK_N=32", "--vary", "scale=none",
                       "--vary", "dtype=float64", "--rows", "1"]) == 0
    out = capsys.readouterr().out
    for header in ("-- as recorded", "-- BLOCK_N=32", "-- scale=none", "-- dtype=float64"):
        assert header in out
    rows = [line for line in out.splitlines() if "lse" in line and "oracle" in line]
    assert len(rows) == 3 * 12            # three runnable variants x 12 heads x 1 row
    assert all("nonfinite out 0/32" in line for line in rows)        # the interpreter passes it
    refused = out.split("-- dtype=float64")[1]
    assert "Error" in refused and "lse" not in refused


def test_launch_census_draws_the_same_cases_and_attributes_calls_to_the_innermost_stage(capsys):
    """benchmarks/launch_census.py: its cases are the campaign strategy's under a fixed seed (the
    same list twice), a runtime call belongs to the innermost stage around it, its stage wrappers
    are undone afterwards, and without CUDA it says so instead of counting nothing."""
    import fuzzattn.judge.judge as judge_module
    import fuzzattn.run.runs as runs_module
    census = _script("launch_census")
    impl = registry.get("sdpa_math")
    profile = PROFILES["gpu"]        # not settings.load_profile: that switches the worker's profile
    first = census.draw(impl, "float32", profile, 12)
    assert len(first) == 12 and first == census.draw(impl, "float32", profile, 12)
    ranges = [(0, 10, "run"), (2, 5, "implementation"), (6, 9, "checks")]
    assert [census._innermost(ranges, t) for t in (1, 3, 5.5, 7)] == \
        ["run", "implementation", "run", "checks"]
    assert census._innermost(ranges, 11).startswith("other")
    originals = (judge_module.oracle, runs_module.launch, runs_module.deliver)
    restore = census._timed_phases()
    assert all(now is not then for now, then in
               zip((judge_module.oracle, runs_module.launch, runs_module.deliver), originals))
    restore()
    assert (judge_module.oracle, runs_module.launch, runs_module.deliver) == originals
    if not torch.cuda.is_available():
        assert census.main(["--cases", "1"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


def test_contention_probe_times_the_device_part_of_judging_and_needs_cuda_for_the_rest(capsys):
    """benchmarks/contention_probe.py: `runs` times the two runs of drawn cases (on the CPU here,
    where nothing waits) and prints one JSON line; `syncs` and `launches` measure CUDA contexts,
    so without a GPU they say so instead of timing nothing."""
    import json
    probe = _script("contention_probe")
    threads = torch.get_num_threads()
    try:
        assert probe.main(["runs", "--seconds", "0.3", "--cases", "3"]) == 0
    finally:
        torch.set_num_threads(threads)       # the probe pins one, as its measurements run
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["mode"] == "runs" and line["distinct_cases"] == 3
    assert line["cases"] >= 1 and line["per_second"] > 0
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            probe.main(["syncs", "--seconds", "0.1"])
        assert "no GPU is visible here" in capsys.readouterr().err


def test_stage_times_and_host_profile_account_for_the_judged_cases(tmp_path, capsys):
    """gpu_campaign.py --stage-times and --cprofile: the stage timers add up inside the campaign's
    time and are removed after; both summaries print per judged case."""
    from fuzzattn.campaigns import campaign as campaign_module
    judge_before = campaign_module.judge
    campaign = _script("gpu_campaign")
    timers, stats = tmp_path / "stages.json", tmp_path / "run.stats"
    from fuzzattn.cli import _profile_restored
    with _profile_restored():
        assert campaign.main(["--seconds", "1.5", "--out", str(tmp_path), "--profile", "ci",
                              "--impl", "sdpa", "--dtype", "float32", "--gradient-every", "2",
                              "--stage-times", str(timers), "--cprofile", str(stats)]) == 0
    assert campaign_module.judge is judge_before         # the timers are gone again
    record = json.loads(timers.read_text())
    stages = record["stages"]
    assert record["cases"] > 0 and 0 < stages["judge"] <= record["seconds"]
    assert 0 < stages["oracle"] < stages["judge"] and 0 < stages["gradients"] < stages["judge"]
    assert int(Path(f"{stats}.cases").read_text()) == record["cases"]
    _script("stage_times").main([str(timers)])
    _script("host_profile").main([str(stats), "--top", "5"])
    out = capsys.readouterr().out
    assert f"{'judged cases':<34}" in out and f"{record['cases']} judged cases" in out
    assert "value checks" in out and "top 5 by own time" in out
