"""The maintained scripts of benchmarks/, smoke-run on the CPU with tiny arguments: each runs as
its docstring says, and every command that its docstring, benchmarks/REPORT.md or
benchmarks/gpu_run.sh gives names a script and options that exist. What needs CUDA (speed.py's
tables, gpu_run.sh's steps) is checked up to where it would start on a GPU."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fuzzattn.campaigns.regression_file import ExpectedFailure, RegressionFile, write
from fuzzattn.cli import _profile_restored
from fuzzattn.contract.case import AttentionCase
from fuzzattn.judgement.judge import default_device
from fuzzattn.settings import device_description

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
BUILT = ROOT / "tests" / "purpose_built.py"
PYTHON_SCRIPTS = ("calibrate_error_stats", "compile_variants", "gpu_campaign", "gpu_triage",
                  "scan_small_outputs", "sdpa_shapes", "speed", "throughput", "verdict_digest")
_loaded: dict = {}


def _script(name: str):
    if name not in _loaded:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded[name] = module
    return _loaded[name]


@pytest.fixture
def restored():
    """Scripts load a profile (Hypothesis's and FUZZATTN_PROFILE) and pin torch's threads, as
    they must when run; put back what this test process had."""
    threads = torch.get_num_threads()
    with _profile_restored():
        yield
    torch.set_num_threads(threads)


def _help(name: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        _script(name).main(["--help"])
    assert exited.value.code == 0
    return out.getvalue()


def _commands(text: str) -> list[tuple[str, list[str]]]:
    """(script, options) of every `benchmarks/NAME.py ...` command in a text; a shell line's
    continuations joined, a command ending at a backtick, a redirection or a pipe."""
    text = text.replace("\\\n", " ")
    return [(script, re.findall(r"(?<![\w-])--[a-z][\w-]*", args))
            for script, args in re.findall(r"benchmarks/(\w+\.(?:py|sh))([^\n`|;&>]*)", text)]


def test_benchmarks_holds_the_maintained_scripts_and_the_report():
    files = {p.name for p in BENCH.iterdir() if p.is_file() and p.suffix in (".py", ".sh", ".md")}
    assert files == {f"{name}.py" for name in PYTHON_SCRIPTS} | {"gpu_run.sh", "REPORT.md"}


@pytest.mark.parametrize("source", ["REPORT.md", "gpu_run.sh"] + [f"{n}.py" for n in PYTHON_SCRIPTS])
def test_documented_commands_name_existing_scripts_and_options(source):
    text = (BENCH / source).read_text()
    if source.endswith(".py"):
        text = _script(source[:-3]).__doc__
    commands = _commands(text)
    if source != "gpu_run.sh":
        assert commands, f"{source} documents no command"
    for script, options in commands:
        assert (BENCH / script).is_file(), f"{source} names benchmarks/{script}"
        if script.endswith(".py"):
            known = _help(script[:-3])
            missing = [o for o in options if not re.search(rf"{re.escape(o)}(?![\w-])", known)]
            assert not missing, f"{source}: {script} has no {missing}"


def test_the_report_stays_short_and_dated():
    lines = (BENCH / "REPORT.md").read_text().splitlines()
    assert len(lines) <= 200
    assert sum(bool(re.search(r"\b2026-\d\d-\d\d\b", line)) for line in lines) >= 8


# -- sdpa_shapes.py ------------------------------------------------------------------------------

def test_sdpa_shapes_times_first_and_repeated_calls_per_backend(capsys):
    assert _script("sdpa_shapes").main(["--shapes", "2", "--repeats", "1", "--device", "cpu",
                                        "--dtypes", "float32"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[1] for row in rows] == ["default", "flash", "efficient", "cudnn", "math"]
    timed = [row for row in rows if row[2] != "refused:"]
    assert timed and all(float(row[2]) > 0 and float(row[3]) > 0 for row in timed)
    assert rows[0][5] == "FLASH_ATTENTION"     # what the CPU build's default dispatch picks


# -- throughput.py ------------------------------------------------------------------------------

def ratio_of_printed(ratio: str, numerator: str, denominator: str) -> bool:
    """Whether a printed ratio is the ratio of two printed rates, as far as their rounding
    allows: each is off by up to half its last printed digit (4.3 / 5.4 printed for 0.787)."""
    def half(text: str) -> float:
        return 0.5 * 10.0 ** -(len(text.split(".")[1]) if "." in text else 0)
    n, d, r = float(numerator), float(denominator), float(ratio)
    hn, hd, hr = half(numerator), half(denominator), half(ratio)
    return (n - hn) / (d + hd) - hr <= r <= (n + hn) / max(d - hd, 1e-9) + hr

def test_throughput_prints_the_rates_and_a_stage_table_that_adds_up(restored, capsys):
    throughput = _script("throughput")
    assert throughput.unresolved() == []      # every timed stage names a function of this tree
    assert throughput.main(["--cases", "4", "--impl", "sdpa", "--dtype", "float32",
                            "--gradient-every", "2"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("sdpa ")]
    name, dtype, cases, rate, bare, ratio, spread, verdict = row.split()
    assert (dtype, cases, verdict) == ("float32", "4", "pass")
    assert float(rate) > 0 and float(bare) > 0 and ratio_of_printed(ratio, bare, rate)
    stages = {line[:28].strip(): float(line[28:]) for line in out.split("ms per judged case")[1].splitlines()[1:]
              if line[:28].strip() and line[:28].strip() != "judged cases"}
    for stage in ("materialise", "runs: launch", "oracle", "value checks", "gradients", "gradients: runs"):
        assert stages[stage] > 0, stage
    assert stages["gradients: runs"] < stages["gradients"] < stages["judge"] < stages["all"]
    assert stages["judge"] + stages["outside the judge"] == pytest.approx(stages["all"], abs=0.02)


def test_throughput_of_the_command_watched_and_in_process(capsys):
    """--cli times `fuzzattn fuzz` as a user types it, watched and with FUZZATTN_SUPERVISE=off."""
    throughput = _script("throughput")
    assert throughput.main(["--cli", "--cases", "20", "--impl", "sdpa", "--dtype", "float32"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sdpa ")]
    name, dtype, cases, watched, plain, ratio, spread = row.split()
    assert (dtype, cases) == ("float32", "20") and float(watched) > 0 and float(plain) > 0
    assert ratio_of_printed(ratio, watched, plain)


def test_throughput_of_the_command_over_workers(capsys):
    """--cli-workers times `fuzzattn fuzz --workers N --seconds S` as typed, for N and for 1."""
    throughput = _script("throughput")
    assert throughput.main(["--cli-workers", "2", "--seconds", "6", "--impl", "sdpa", "--dtype",
                            "float32", "--profile", "dev"]) == 0
    out = capsys.readouterr().out
    assert "--workers N --seconds 6" in out.splitlines()[0]
    one, two = [line.split() for line in out.splitlines() if line.startswith("sdpa ")]
    assert [r[2] for r in (one, two)] == ["1", "2"] and one[5] == "1.00"
    assert int(one[3]) > 0 and float(one[4]) > 0                  # the in-process campaign judged
    assert ratio_of_printed(two[5], two[4], one[4])
    with pytest.raises(SystemExit):
        throughput.main(["--cli-workers", "1,zero"])


# -- gpu_campaign.py ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two tiny runs into one --out: a real implementation and one that fails on bottom-right
    cases, with an expected-failure file covering that failure."""
    campaign = _script("gpu_campaign")
    out, known = tmp_path_factory.mktemp("runs"), tmp_path_factory.mktemp("known")
    case = AttentionCase(1, 1, 1, 2, 5, 16, causal="bottom_right")
    write(RegressionFile(case=case, expected_failures={"bottom_right_as_top_left": ExpectedFailure(
        "planted", device=default_device())}), known)
    argv = ["--seconds", "3", "--profile", "ci", "--out", str(out), "--known-regressions", str(known),
            "--impl", "sdpa_math", "--impl", f"{BUILT}:BOTTOM_RIGHT_AS_TOP_LEFT", "--dtype", "float32"]
    threads = torch.get_num_threads()
    with _profile_restored():
        assert campaign.main(argv) == 0
        assert campaign.main(argv) == 0
    torch.set_num_threads(threads)
    results = sorted(out.glob("gpu_campaign_*.json"), key=lambda p: json.loads(p.read_text())["shard"])
    return out, [json.loads(p.read_text()) for p in results]


def test_each_run_writes_one_result_with_its_device_versions_and_campaigns(two_runs):
    _, results = two_runs
    assert len(results) == 2
    for result in results:
        assert result["date"] and result["profile"] == "ci" and result["device"] == device_description()
        assert {"torch", "triton", "hypothesis", "fuzzattn"} <= set(result["versions"])
        by_impl = {c["impl"]: c for c in result["campaigns"]}
        assert set(by_impl) == {"sdpa_math", "bottom_right_as_top_left"}
        for c in result["campaigns"]:
            assert c["dtype"] == "float32" and c["cases"] >= 0 and c["seconds"] > 0
        assert by_impl["sdpa_math"]["failures"] == []


def test_runs_are_shards_with_distinct_seeds(two_runs):
    _, results = two_runs
    assert [r["shard"] for r in results] == [0, 1]
    seeds = [{s for c in r["campaigns"] for s in c["hypothesis_seeds"]} for r in results]
    assert seeds[0] and seeds[1] and not seeds[0] & seeds[1]


def test_a_failure_names_its_file_and_the_expected_failure_covering_it(two_runs):
    out, results = two_runs
    failures = [f for r in results for c in r["campaigns"] for f in c["failures"]]
    assert failures, "the bottom-right bug was not found"
    for f in failures:
        assert f["case"]["causal"] == "bottom_right" and f["check"]
        assert Path(f["file"]).is_file() and Path(f["file"]).parent == out / "regressions"
        assert len(f["covered_by"]) == 1


def test_the_report_sums_the_runs_and_lists_each_finding_once(two_runs, capsys):
    out, results = two_runs
    assert _script("gpu_campaign").main(["--report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "- runs: 2 (shards 0, 1)" in text and "torch 2" in text
    total = sum(c["cases"] for r in results for c in r["campaigns"] if c["impl"] == "sdpa_math")
    (row,) = [line for line in text.splitlines() if line.startswith("| sdpa_math | float32 |")]
    assert row.split("|")[3].strip() == str(total)
    everything = sum(c["cases"] for r in results for c in r["campaigns"])
    assert f"{everything} cases judged in all" in text
    findings = [line for line in text.split("Findings:")[1].splitlines()
                if line.startswith("| bottom_right_as_top_left |")]
    covering = {f["covered_by"][0] for r in results for c in r["campaigns"] for f in c["failures"]}
    assert findings and all(any(name in line for name in covering) for line in findings)


def test_the_report_refuses_what_is_not_a_result_and_a_run_needs_its_budget(tmp_path):
    campaign = _script("gpu_campaign")
    (tmp_path / "gpu_campaign_x.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a gpu_campaign result"):
        campaign.main(["--report", str(tmp_path)])
    with pytest.raises(SystemExit):
        campaign.main(["--out", str(tmp_path)])          # no --seconds, no --report


def test_parts_split_the_plan_and_isolated_runs_record_how_they_judged(tmp_path, restored):
    """--part I/N takes every Nth campaign of the plan, wrapping around past its end; --isolate
    judges in a worker process and the result says so."""
    campaign = _script("gpu_campaign")
    base = ["--seconds", "2", "--profile", "ci", "--impl", "sdpa_math", "--impl", "torch_tiled",
            "--dtype", "float32"]
    assert campaign.main(base + ["--out", str(tmp_path / "a"), "--part", "1/2"]) == 0
    assert campaign.main(base + ["--out", str(tmp_path / "b"), "--part", "3/5", "--shard", "7"]) == 0
    assert campaign.main(["--seconds", "2", "--profile", "ci", "--impl", "sdpa_math", "--dtype",
                          "float32", "--out", str(tmp_path / "c"), "--isolate",
                          "--gradient-every", "3"]) == 0
    with pytest.raises(SystemExit):
        campaign.main(base + ["--out", str(tmp_path / "d"), "--part", "2/2"])
    (a,), (b,), (c,) = ([json.loads(p.read_text()) for p in (tmp_path / d).glob("gpu_campaign_*.json")]
                        for d in "abc")
    assert [x["impl"] for x in a["campaigns"]] == ["torch_tiled"]
    assert b["shard"] == 7 and [x["impl"] for x in b["campaigns"]] == ["torch_tiled"]
    assert c["isolated"] is True and c["gradient_every"] == 3
    assert all(x["isolation"] == {"hangs": 0, "device_faults": 0} for x in c["campaigns"])


def test_warm_up_cases_are_judged_before_the_clock_and_counted_nowhere(tmp_path, monkeypatch, restored):
    campaign = _script("gpu_campaign")
    import fuzzattn.campaigns.campaign as campaigns
    calls, real = [], campaigns.fuzz

    def recorded(impl, strategy, **kw):
        result = real(impl, strategy, **kw)
        calls.append((kw, result.cases))
        return result

    monkeypatch.setattr(campaigns, "fuzz", recorded)
    assert campaign.main(["--seconds", "2", "--profile", "ci", "--impl", "sdpa_math", "--dtype",
                          "float32", "--out", str(tmp_path), "--warm-up", "4"]) == 0
    (result,) = [json.loads(p.read_text()) for p in tmp_path.glob("gpu_campaign_*.json")]
    (entry,) = result["campaigns"]
    (warm, warm_cases), *timed = calls
    assert warm["max_examples"] == 4 and warm_cases == 4 and not warm["save_to_file"]
    assert warm["gradient_every"] == 1 and warm.get("seconds") is None
    assert warm["hypothesis_seed_value"] not in entry["hypothesis_seeds"]
    assert timed and entry["cases"] == sum(cases for _, cases in timed)


def test_stage_times_are_written_printed_and_removed_after(tmp_path, restored, capsys):
    from fuzzattn.campaigns import verdicts as memo
    judge_before = memo.judge
    timers = tmp_path / "stages.json"
    assert _script("gpu_campaign").main(["--seconds", "1.5", "--out", str(tmp_path), "--profile", "ci",
                                         "--impl", "sdpa", "--dtype", "float32", "--gradient-every",
                                         "2", "--stage-times", str(timers)]) == 0
    assert memo.judge is judge_before
    record = json.loads(timers.read_text())
    stages = record["stages"]
    assert record["cases"] > 0 and 0 < stages["judge"] <= record["seconds"]
    assert 0 < stages["oracle"] < stages["judge"] and 0 < stages["gradients"] < stages["judge"]
    out = capsys.readouterr().out
    assert re.search(rf"judged cases\s+{record['cases']}\n", out) and "outside the judge" in out


# -- gpu_triage.py ------------------------------------------------------------------------------

def test_triage_judges_each_file_per_implementation_forward_and_with_gradients(restored, capsys):
    """A configless file and one with sdpa_math's configuration, which torch_tiled does not
    accept (dropped, not refused), judged in a worker; and a name that is not registered."""
    files = [str(ROOT / "regressions" / "fcde2197009b.json"), str(ROOT / "regressions" / "016e68cd71a9.json")]
    assert _script("gpu_triage").main(files + ["--impl", "torch_tiled", "--impl", "no_such_impl"]) == 0
    lines = capsys.readouterr().out.splitlines()
    judged = [line for line in lines if "forward:" in line]
    assert [line.split()[:2] for line in judged] == [["fcde2197009b.json", "torch_tiled"],
                                                     ["016e68cd71a9.json", "torch_tiled"]], lines
    assert all("forward: ok" in line and line.rstrip().endswith("with gradients: ok") for line in judged)
    assert "no_such_impl: not a registered implementation" in lines


# -- speed.py -----------------------------------------------------------------------------------

def test_speed_counts_flops_and_reads_backward_configurations():
    speed = _script("speed")
    assert speed.forward_flops(4, 16, 1024, 64, False) == 4 * 4 * 16 * 1024 * 1024 * 64
    assert speed.forward_flops(4, 16, 1024, 64, True) == speed.forward_flops(4, 16, 1024, 64, False) / 2
    assert speed.backward_flops(1, 2, 256, 128, True) == 2.5 * speed.forward_flops(1, 2, 256, 128, True)
    assert speed.parse_config("BLOCK_M=64,BLOCK_N=32,num_warps=4") == dict(BLOCK_M=64, BLOCK_N=32, num_warps=4)
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        speed.main(["--config", "BLOCK_Q=64"])
    assert "--pass {forward,backward,both}" in _help("speed")


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the tables run: time them with speed.py itself")
def test_speed_without_cuda_says_so_and_exits_2(capsys):
    assert _script("speed").main(["--pass", "forward"]) == 2
    assert "CUDA GPU" in capsys.readouterr().err
    assert os.environ.get("TRITON_INTERPRET") != "0"          # nothing set before the check


# -- calibrate_error_stats.py, compile_variants.py, verdict_digest.py ---------------------------

def test_calibration_judges_real_kernels_and_the_precision_mutants(restored, monkeypatch, capsys):
    monkeypatch.setenv("FUZZATTN_PROFILE", "ci")
    calibrate = _script("calibrate_error_stats")
    assert calibrate.main(["--cases", "3", "--triton-cases", "0", "--mutant-cases", "3"]) == 0
    out = capsys.readouterr().out
    judged = int(re.search(r"real-kernel cases judged: (\d+); out_rms false positives: 0\n", out)[1])
    assert 0 < judged <= 2 * 3 * 3
    for mutant in calibrate.PRECISION_MUTANTS:
        assert mutant in out.split("precision mutants")[1]


def _compile_variants(*args: str) -> list[str]:
    """Run as documented, in a process of its own: it must import the kernels compiled."""
    done = subprocess.run([sys.executable, str(BENCH / "compile_variants.py"), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def test_compile_variants_counts_forward_and_backward_variants_by_axis():
    lines = _compile_variants("--cases", "3", "--dtype", "float16", "--palette", "0")
    assert lines[0] == "palette=0 dtype=float16 gradient_every=4"
    cases, forward, backward = (int(x) for x in lines[2].split()[:3])
    assert cases == 3 and 1 <= forward <= 3 and backward >= 1    # the first case runs the backward
    total = forward + backward
    assert lines[3] == f"forward+backward variants per 1,000 cases: {1000 * total / 3:.1f}"
    axes = {line[:22].strip(): line.split()[-2:] for line in lines[6:12]}
    assert list(axes) == ["config", "head dim (BLOCK_D)", "variant flags", "dtype",
                          "pointer alignment", "row/element strides"]
    assert all(1 <= int(parts) and int(without) <= total for parts, without in axes.values())
    seen = {line[:26].strip(): (int(line.split()[-2]), int(line.split()[-1])) for line in lines[14:]}
    assert seen["head dim class (BLOCK_D)"] == (4, 1) and seen["dtype"] == (1, 1)
    assert all(1 <= n <= declared for declared, n in seen.values())


def test_compile_variants_rotates_palettes_as_a_campaign_does():
    lines = _compile_variants("--cases", "6", "--dtype", "float16", "--palette", "0",
                              "--rotate-every", "2", "--shards", "1")
    assert lines[0].endswith("rotate_every=2 shards=1 palettes=3")
    seen = {line[:26].strip(): int(line.split()[-1]) for line in lines[14:]}
    assert seen["head dim class (BLOCK_D)"] == 3   # palettes 0, 1, 2: one class each, all apart


def test_verdict_digest_writes_every_row_and_compares_by_line(tmp_path, restored):
    digest = _script("verdict_digest")
    out = tmp_path / "digest.txt"
    assert digest.main([str(out), "--cases", "2"]) == 0
    lines = out.read_text().splitlines()
    rows = dict.fromkeys(" ".join(line.split()[:2]) for line in lines if not line.startswith("  "))
    assert list(rows) == [f"{impl} {dtype}" for impl, dtype in digest.JUDGED]
    assert all(len(line.split()) >= 3 for line in lines if line.startswith("  "))
    assert digest.main(["--compare", str(out), str(out)]) == 0
    verdict = next(i for i, line in enumerate(lines) if re.match(r"  \w+ True \d", line))
    numbers, flipped = tmp_path / "numbers.txt", tmp_path / "flipped.txt"
    moved = re.sub(r"(True )(\d)", lambda m: m[1] + str((int(m[2]) + 1) % 10), lines[verdict], count=1)
    numbers.write_text("\n".join(lines[:verdict] + [moved] + lines[verdict + 1:]) + "\n")
    flipped.write_text("\n".join(lines[:verdict] + [lines[verdict].replace(" True ", " False ", 1)]
                                 + lines[verdict + 1:]) + "\n")
    assert digest.main(["--compare", str(out), str(numbers)]) == 0
    assert digest.main(["--compare", str(out), str(flipped)]) == 1


# -- gpu_run.sh ---------------------------------------------------------------------------------

def test_gpu_run_parses_and_stops_before_installing_without_a_gpu(tmp_path):
    script = BENCH / "gpu_run.sh"
    parsed = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}", OUT=str(tmp_path / "out"))
    done = subprocess.run(["bash", str(script), "speed"], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=60)
    assert done.returncode == 2 and "no GPU visible" in done.stdout
    assert not (tmp_path / "out").exists()
