"""examples/two_bug_attention.py: two independent causes, each showing under several checks (V
read through K's strides crashes on some layouts and gives wrong values on others; the last key
dropped when Nk is odd), reported as exactly two defects with one file each, with one worker or
two, and a second run on the same directory writes no file."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from fuzzattn import cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "two_bug_attention.py"
SPEC = f"{EXAMPLE}:TWO_BUGS"


def _fuzz(directory: Path, workers: int, seed: int) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(["fuzz", "--impl", SPEC, "--profile", "dev", "--database", "off",
                           "--workers", str(workers), "--hypothesis-seed", str(seed),
                           "--regressions-dir", str(directory)])
    return status, out.getvalue()


def _causes(directory: Path) -> list[str]:
    return sorted(json.loads(p.read_text())["cause"] for p in directory.glob("*.json"))


@pytest.mark.parametrize("workers", [1, 2])
def test_two_causes_are_two_rows_and_two_files(tmp_path, workers):
    status, out = _fuzz(tmp_path, workers, seed=0)
    assert status == 1, out
    table = out.split("defects by cause")[1].split("\n\n")[0]
    rows = [line for line in table.splitlines() if line.startswith("two_bugs float32")]
    assert len(rows) == 2, table
    assert any("Nk odd" in row for row in rows), table
    assert any("layout[k]≠layout[v]" in row for row in rows), table
    assert _causes(tmp_path) == ["needs Nk odd", "needs layout[k]≠layout[v]"], out
    # the stride cause showed as a crash and as wrong values: one row lists both
    stride = next(row for row in rows if "layout[k]≠layout[v]" in row)
    assert "crash: RuntimeError" in stride and "out" in stride.replace("out_of_bounds", ""), table


def test_a_second_run_on_the_same_directory_adds_no_file(tmp_path):
    _fuzz(tmp_path, 1, seed=0)
    first = sorted(p.name for p in tmp_path.glob("*.json"))
    status, out = _fuzz(tmp_path, 1, seed=3)       # other draws, other shrunk cases
    assert status == 1, out
    assert sorted(p.name for p in tmp_path.glob("*.json")) == first, out
    assert len(first) == 2
