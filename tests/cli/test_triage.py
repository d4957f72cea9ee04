"""`fuzzattn triage DIR`: a directory flooded with files of two bugs is grouped into two causes,
and --prune leaves one file per cause, each recording its cause; files that pass now are kept."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
from pathlib import Path

from fuzzattn import cli
from fuzzattn.campaigns.campaign import judge_once
from fuzzattn.campaigns.found import save
from fuzzattn.contract.case import AttentionCase

from examples.two_bug_attention import TWO_BUGS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "two_bug_attention.py"
SPEC = f"{EXAMPLE}:TWO_BUGS"
MINE = dataclasses.replace(TWO_BUGS, spec=SPEC)       # as `--impl FILE.py:TWO_BUGS` loads it
PLAIN = AttentionCase(batch=1, heads=2, kv_heads=2, seq_q=4, seq_k=4, head_dim=8)
FLOOD = [  # three cases of V read through K's strides, two of the odd Nk, one that passes
    PLAIN.replace(layout=("contiguous", "contiguous", "transposed")),
    PLAIN.replace(layout=("contiguous", "transposed", "contiguous"), seq_q=6, seq_k=8),
    PLAIN.replace(layout=("contiguous", "contiguous", "sliced"), batch=2, data_seed=5),
    PLAIN.replace(seq_k=5),
    PLAIN.replace(seq_q=3, seq_k=9, head_dim=16),
    PLAIN,
]


def _flood(directory: Path) -> list[Path]:
    paths = []
    for i, case in enumerate(FLOOD):
        judged = judge_once(MINE, case)
        path = directory / f"{case.key()}.json"
        if judged.passed:
            from fuzzattn.campaigns.regression_file import RegressionFile
            path.write_text(RegressionFile(case=case, covers="a case that passes",
                                           impl=TWO_BUGS.name, impl_spec=SPEC).to_json())
        else:
            path = save(judged, directory).path
        os.utime(path, ns=(10**18 + i, 10**18 + i))        # oldest first, in FLOOD's order
        paths.append(path)
    return paths


def _triage(*args) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(["triage", *map(str, args)])
    return status, out.getvalue()


def test_a_flood_of_two_bugs_is_two_causes_and_prune_keeps_the_oldest_of_each(tmp_path):
    paths = _flood(tmp_path)
    status, out = _triage(tmp_path)
    assert status == 0, out
    rows = [line for line in out.splitlines() if line.startswith("two_bugs")]
    assert len(rows) == 2, out
    assert any("Nk odd" in r and " 2 " in r for r in rows), out
    assert any("layout[k]≠layout[v]" in r and " 3 " in r for r in rows), out
    assert "5 failing file(s) of 6: 2 cause(s), 3 duplicate file(s); --prune removes them" in out
    assert f"{paths[5].name}: passes now on two_bugs" in out
    assert len(list(tmp_path.glob("*.json"))) == 6          # a report changes nothing

    status, out = _triage(tmp_path, "--prune")
    assert status == 0 and "removed 3" in out, out
    left = sorted(tmp_path.glob("*.json"))
    assert left == sorted([paths[0], paths[3], paths[5]]), out
    causes = {json.loads(p.read_text()).get("cause") for p in left}
    assert causes == {"needs layout[k]≠layout[v]", "needs Nk odd", None}

    status, out = _triage(tmp_path)                         # pruned: nothing more to remove
    assert "2 cause(s), 0 duplicate file(s)" in out, out


def test_triage_of_what_is_not_a_directory_is_one_line(tmp_path, capsys):
    assert cli.main(["triage", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    assert "not a directory of regression files" in err and len(err.strip().splitlines()) == 1
