"""`fuzzattn explain FILE --impl NAME`: on purpose-built implementations whose failure depends on
one known factor, the triage names that factor; bad arguments are one-line usage errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fuzzattn import cli
from fuzzattn.campaigns.regression_file import RegressionFile, write
from fuzzattn.contract.case import AttentionCase
from fuzzattn.inputs.materialize import inputs_sha256, materialize

BUILT = Path(__file__).resolve().parents[1] / "purpose_built.py"


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("FUZZATTN_REGRESSIONS_DIR", str(tmp_path / "default-fixtures"))


def _file(directory: Path, case: AttentionCase) -> Path:
    record = RegressionFile(case=case, inputs_sha256=inputs_sha256(materialize(case)))
    return write(record, directory).path


def explain(capsys, path, impl):
    status = cli.main(["explain", str(path), "--impl", impl])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def rows(out: str) -> dict[str, list[str]]:
    """changed-to -> [factor, verdict, ...] from the printed table."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("factor"))
    table = {}
    for line in lines[start + 2:]:
        if not line.strip() or line.startswith(("passes when", "the recorded")):
            break
        cells = [c for c in line.split("  ") if c.strip()]
        table[cells[1].strip()] = [cells[0].strip()] + [c.strip() for c in cells[2:]]
    return table


def reading(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("passes when"))


def test_a_bottom_right_bug_is_explained_by_causal(capsys, tmp_path):
    case = AttentionCase(1, 2, 2, 3, 7, 16, causal="bottom_right", scale=0.5,
                         layout=("transposed", "contiguous", "contiguous"), values="dominant_key")
    status, out, err = explain(capsys, _file(tmp_path, case), f"{BUILT}:BOTTOM_RIGHT_AS_TOP_LEFT")
    assert status == 0, out + err
    table = rows(out)
    assert table["-"][:2] == ["as recorded", "FAIL"]
    assert table["causal=none"][1] == "pass"
    for other in ("values=normal", "layout=contiguous", "scale=default", "dtype=bfloat16", "dtype=float16"):
        assert table[other][1] == "FAIL", other
    # the alignments differ only when Nq != Nk: equal lengths either way pass too
    assert reading(out).startswith("passes when: causal=none, Nk=3, Nq=7; still fails when: "
                                   "values=normal")
    assert out.strip().splitlines()[-1] == "needs: causal=bottom_right lengths=Nq<Nk"


def test_a_large_values_bug_is_explained_by_values(capsys, tmp_path):
    case = AttentionCase(1, 1, 1, 4, 6, 32, causal="top_left", scale=1.0, values="large")
    status, out, _ = explain(capsys, _file(tmp_path, case), f"{BUILT}:NO_RUNNING_MAX")
    assert status == 0
    table = rows(out)
    assert table["-"][1] == "FAIL" and table["-"][2] == "nonfinite"
    assert table["values=normal"][1] == "pass"
    assert reading(out).startswith("passes when: values=normal; still fails when:")


@pytest.mark.parametrize("recorded", ["segfault", "out"])
def test_a_file_that_kills_its_judge_is_explained_one_worker_per_variant(tmp_path, recorded):
    """A segfault file: each variant is judged in a worker of its own (in-process the first would
    end the command), the crash is the baseline's check, and values=normal passes. A file that
    records a value failure but now crashes its kernel ends the first, in-process try: the
    explain runs again isolated, to the same table. Neither saves the crash: its case is a file."""
    import json
    import subprocess
    import sys
    case = AttentionCase(1, 1, 1, 4, 6, 32, causal="top_left", scale=1.0, values="large")
    path = _file(tmp_path, case)
    path.write_text(json.dumps({**json.loads(path.read_text()), "check": recorded}))
    done = subprocess.run([sys.executable, "-m", "fuzzattn.cli", "explain", str(path), "--impl",
                           f"{BUILT}:SEGFAULT_ON_LARGE"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("fuzzattn: explain again, isolated" in done.stderr) == (recorded == "out"), done.stderr
    assert not (tmp_path / "default-fixtures").exists(), done.stdout
    assert "each variant judged in a worker process of its own" in done.stdout
    table = rows(done.stdout)
    assert table["-"][1:3] == ["FAIL", "segfault"], table
    assert table["values=normal"][1] == "pass"
    assert table["causal=none"][1:3] == ["FAIL", "segfault"]      # the worker after a crash too
    assert done.stdout.strip().splitlines()[-1].startswith("passes when: values=normal")
    # each variant was announced on stderr as it was judged, with the table's verdict
    progress = [line for line in done.stderr.splitlines() if line.startswith("explain ")]
    assert len(progress) == len(table), done.stderr
    for number, line in enumerate(progress, 1):
        head, changed_to, verdict = line.split("  ")[:3]
        assert head == f"explain {number}/{len(table)}"
        key = "-" if changed_to == "as recorded" else changed_to
        assert verdict.split(" ")[0] == table[key][1], line


def test_a_configuration_bug_is_explained_by_its_axis(capsys, tmp_path):
    case = AttentionCase(1, 1, 1, 3, 9, 16, config=(("tile", 7),))
    status, out, _ = explain(capsys, _file(tmp_path, case), f"{BUILT}:TILED")
    assert status == 0
    table = rows(out)
    assert table["tile=16"][:2] == ["tile", "pass"]
    # a numeric check shows error / allowed, the failing one far over it
    error, allowed = (float(x) for x in table["-"][-1].split(" / "))
    assert error > allowed
    assert "passes when: tile=16" in out


def test_an_sdpa_backend_is_compared_with_every_other_backend(capsys):
    # the repository's own leak file: on this machine it passes, so there is nothing to explain,
    # but every other backend and the other mask form are rows (absent backends say so)
    from fuzzattn.run.registry import implementations
    leak = next(p for p in sorted(Path("regressions").glob("*.json"))
                if "sdpa_cudnn" in p.read_text())
    status, out, _ = explain(capsys, leak, "sdpa_math")
    assert status == 0
    table = rows(out)
    for name in ("sdpa", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn"):
        key = next(k for k in table if k.split(" ")[0] == name)
        assert table[key][0] == "backend"
        if name not in implementations():
            assert table[key][1] == "not declared" and "absent here" in table[key][2]
    assert table["mask_form=float"][0] == "mask_form"
    if "sdpa_cudnn" not in implementations():
        assert "the recorded case passes here" in out


@pytest.mark.parametrize("argv,expected", [
    (["explain", "missing.json", "--impl", "sdpa"], "no such regression file"),
    (["explain", "{folder}", "--impl", "sdpa"], "a directory; explain takes one regression file"),
    (["explain", "{bad}", "--impl", "sdpa"], "not valid JSON"),
    (["explain", "{good}", "--impl", "no_such_impl"], "unknown implementation"),
    (["explain", "{good}", "--impl", "{built}:TILED"], "does not declare the file's case"),
    (["explain", "{good}"], "--impl"),
])
def test_bad_arguments_are_one_line_usage_errors(capsys, tmp_path, argv, expected):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    good = _file(tmp_path, AttentionCase(1, 1, 1, 2, 5, 16, causal="bottom_right"))
    argv = [a.format(bad=bad, good=good, built=BUILT, folder=tmp_path) for a in argv]   # TILED: top-left only
    status = cli.main(argv)
    captured = capsys.readouterr()
    assert status == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fuzzattn: error:") and expected in lines[0]
    assert "Traceback" not in captured.out + captured.err


TWO_BUGS = Path(__file__).resolve().parents[2] / "examples" / "two_bug_attention.py"


def test_explain_varies_the_lengths_and_needs_what_fuzz_would_name(capsys, tmp_path):
    # Nq < Nk and an odd Nk: only the odd Nk is needed, and explain shows why
    case = AttentionCase(1, 2, 2, 4, 5, 8)
    status, out, err = explain(capsys, _file(tmp_path, case), f"{TWO_BUGS}:TWO_BUGS")
    assert status == 0, out + err
    table = rows(out)
    assert table["Nk=4"][:2] == ["lengths=Nq<Nk", "pass"]       # Nk := Nq, even again
    assert table["Nq=5"][:2] == ["lengths=Nq<Nk", "FAIL"]       # Nq := Nk, still odd
    assert table["Nk=6"][:2] == ["Nk odd", "pass"]
    assert out.strip().splitlines()[-1] == "needs: Nk odd"


def test_explain_and_fuzz_name_the_same_cause_for_every_file(capsys, tmp_path):
    status = cli.main(["fuzz", "--impl", f"{TWO_BUGS}:TWO_BUGS", "--profile", "dev",
                       "--database", "off", "--workers", "1", "--regressions-dir", str(tmp_path)])
    capsys.readouterr()
    assert status == 1
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == 2
    for path in files:
        cause = json.loads(path.read_text())["cause"]
        status, out, err = explain(capsys, path, f"{TWO_BUGS}:TWO_BUGS")
        assert status == 0, out + err
        assert out.strip().splitlines()[-1] == cause.replace("needs ", "needs: ", 1), out
