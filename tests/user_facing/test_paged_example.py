"""examples/paged_kv_attention.py: a Triton kernel over a paged KV cache, declared in its own file
with the public API alone. Its seeded bug (each sequence read to the end of its last page, so the
page's poisoned tail joins the softmax) is found by one `fuzzattn fuzz` run as one defect, needing
a paged cache and a partial last page whatever the page size; the same kernel without the bug
passes the same campaign."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from fuzzattn import AttentionCase, cli, judge
from fuzzattn.run.loader import load_implementation

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "paged_kv_attention.py"


def _fuzz(name: str, directory: Path) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(["fuzz", "--impl", f"{EXAMPLE}:{name}", "--dtype", "float32",
                           "--max-examples", "30", "--profile", "dev", "--database", "off",
                           "--hypothesis-seed", "0", "--regressions-dir", str(directory)])
    return status, out.getvalue()


def test_one_run_finds_the_seeded_bug_as_one_cause(tmp_path):
    status, out = _fuzz("PAGED_KV", tmp_path)
    assert status == 1, out
    table = out.split("defects by cause")[1].split("\n\n")[0]
    rows = [line for line in table.splitlines() if line.startswith("paged_kv float32")]
    assert len(rows) == 1 and "last page partial" in rows[0], table
    (saved,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert saved["check"] == "nonfinite", saved
    assert saved["cause"].startswith("needs last page partial paged_kv="), saved
    case = saved["case"]
    assert case.get("paged_kv") and case["seq_k"] % case["paged_kv"], case


def test_the_fixed_kernel_passes_the_same_campaign(tmp_path):
    status, out = _fuzz("PAGED_KV_FIXED", tmp_path)
    assert status == 0, out
    assert not list(tmp_path.glob("*.json")), out


def _case(seq_q, seq_k, paged_kv, **kw) -> AttentionCase:
    return AttentionCase(2, 2, 1, seq_q, seq_k, 16, dtype=kw.pop("dtype", "float32"),
                         paged_kv=paged_kv, **kw)


@pytest.mark.parametrize("case, buggy_passes", [
    (_case(3, 7, 3), False),                                 # page 3 of 3 holds one key
    (_case(5, 9, 4, causal="bottom_right", dtype="float16"), False),
    (_case(4, 5, 16, causal="top_left"), False),             # one page, mostly tail
    (_case(3, 8, 4), True),                                  # whole pages: no tail to read
    (_case(6, 4, 2, causal="bottom_right"), True),           # with rows that see no key
    (_case(3, 7, 0), True),                                  # dense: one page per sequence
], ids=["page3", "page4_fp16_bottom_right", "page16", "whole_pages", "empty_rows", "dense"])
def test_the_bug_needs_a_partial_last_page_and_the_fix_passes_every_case(case, buggy_passes):
    fixed = load_implementation(f"{EXAMPLE}:PAGED_KV_FIXED")
    buggy = load_implementation(f"{EXAMPLE}:PAGED_KV")
    assert judge(fixed, case).passed, judge(fixed, case).describe()
    judged = judge(buggy, case)
    assert judged.passed == buggy_passes, judged.describe()
    if not buggy_passes:
        assert judged.first_failure.check == "nonfinite", judged.describe()
