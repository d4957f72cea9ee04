"""A campaign's time cap (campaign.fuzz(seconds=...)): once spent before any failure, the search
ends at once, instead of Hypothesis drawing up to max_examples more cases left unjudged; once
spent while shrinking a failure, the failure found so far is still reported."""
from __future__ import annotations

import re
import time

import pytest
from hypothesis import strategies as st

from fuzzattn import AttentionCase, Capabilities, Implementation
from fuzzattn.campaigns.campaign import fuzz
from fuzzattn.kernels.sdpa import sdpa_forward

CAPS = Capabilities(dtypes={"float32"}, head_dims=None, causal=("top_left", "bottom_right"),
                    gqa=True, strides="any")


def _slow(q, k, v, *, causal, scale):
    time.sleep(0.02)           # a case costs at least 2 x 20 ms: the cap is reached in a few
    return sdpa_forward(q, k, v, causal=causal, scale=scale)


def _slow_and_wrong_past_3(q, k, v, *, causal, scale):
    out, lse = _slow(q, k, v, causal=causal, scale=scale)
    if q.shape[2] > 3:
        out = out * 1.5        # every case with more than 3 query rows fails `out`
    return out, lse


def _counted(drawn: list):
    def note(seq_q):
        drawn.append(seq_q)
        return AttentionCase(1, 1, 1, seq_q, 5, 16)
    return st.integers(1, 40).map(note)


def test_the_search_ends_when_the_cap_is_spent():
    drawn = []
    impl = Implementation(name="slow", fn=_slow, caps=CAPS, description="correct, 20 ms a call")
    result = fuzz(impl, _counted(drawn), max_examples=3000, seconds=0.3, save_to_file=False,
                  hypothesis_seed_value=0)
    assert result.passed and result.budget_hit
    assert 1 <= result.cases < 3000
    # Every draw but the one that found the cap spent was judged (Hypothesis may replay a
    # case, never draw thousands more).
    assert len(drawn) <= result.cases + 1, (len(drawn), result.cases)


def test_a_failure_found_before_the_cap_is_still_reported_when_shrinking_outlasts_it(tmp_path):
    impl = Implementation(name="slow_wrong", fn=_slow_and_wrong_past_3, caps=CAPS,
                          description="out scaled by 1.5 past 3 query rows")
    cases = st.builds(AttentionCase, batch=st.just(1), heads=st.just(1), kv_heads=st.just(1),
                      seq_q=st.integers(20, 40), seq_k=st.just(5), head_dim=st.just(16))
    result = fuzz(impl, cases, max_examples=200, seconds=0.2, hypothesis_seed_value=0,
                  regressions_dir=tmp_path)
    assert result.counterexample is not None
    assert result.counterexample.judged.first_failure.check == "out"
    assert result.counterexample.judged.case.seq_q > 3
    # its shrink (a share of the cap, 20 ms a call) ended first, and the row says so
    (defect,) = result.defects
    assert defect.shrink_note.startswith("shrink cut short after"), defect.shrink_note


def test_a_campaign_whose_cap_ends_before_its_first_case_is_a_skip_not_a_pass(capsys, tmp_path):
    """`fuzzattn fuzz` (and the gate's shares) must not call a campaign that judged nothing ok."""
    from fuzzattn import cli
    status = cli.main(["fuzz", "--impl", "sdpa", "--dtype", "float32", "--seconds", "1e-9",
                       "--regressions-dir", str(tmp_path), "--database", "off"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("sdpa "))
    assert row.split()[2] == "skip" and "not fuzzed: the time cap of 1e-09 s ended" in row, out
    assert status == 0 and "1 skipped" in out, out


def test_a_campaign_needs_a_case_count_or_a_time_cap():
    impl = Implementation(name="slow", fn=_slow, caps=CAPS, description="correct, 20 ms a call")
    with pytest.raises(ValueError, match="max_examples=None needs seconds"):
        fuzz(impl, _counted([]), max_examples=None, save_to_file=False)


def cells(row: str) -> list[str]:
    return re.split(r"\s{2,}", row.strip())


def _fuzz_row(capsys, tmp_path, *budget) -> tuple[int, str, str]:
    from fuzzattn import cli
    status = cli.main(["fuzz", "--impl", "sdpa", "--dtype", "float32", *budget, "--profile", "dev",
                       "--regressions-dir", str(tmp_path), "--database", "off"])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("fuzzattn fuzz:"))
    return status, header, next(line for line in out.splitlines() if line.startswith("sdpa "))


def test_seconds_alone_runs_that_long_not_the_profiles_case_count(capsys, tmp_path):
    """--seconds alone: the profile's max_examples (dev: 100, sdpa judges that many in well
    under a second) no longer ends the campaign; the time cap does, and the row says so."""
    status, header, row = _fuzz_row(capsys, tmp_path, "--seconds", "2")
    assert status == 0 and "max_examples=unbounded seconds=2" in header, header
    assert row.split()[2] == "ok" and "time cap 2 s" in cells(row), row
    assert "reached after" not in row, row          # said once, in the "ended by" cell


@pytest.mark.parametrize("budget, ended", [
    (["--max-examples", "7"], "7 cases"),
    (["--max-examples", "7", "--seconds", "600"], "7 cases"),
    (["--max-examples", "100000", "--seconds", "1"], "time cap 1 s"),
], ids=["cases-alone", "cases-first", "time-first"])
def test_the_row_says_which_budget_ended_the_campaign(capsys, tmp_path, budget, ended):
    status, _, row = _fuzz_row(capsys, tmp_path, *budget)
    assert status == 0 and ended in cells(row), row
    if ended == "7 cases":
        assert row.split()[3] == "7", row


def test_seconds_bound_the_command_not_each_campaign(capsys, tmp_path):
    """`fuzz --seconds S` over several campaigns (sdpa's three dtypes) runs S seconds in all: the
    campaigns share it, each an equal part of what is left, and each row ends by its time cap."""
    from fuzzattn import cli
    started = time.perf_counter()
    status = cli.main(["fuzz", "--impl", "sdpa", "--seconds", "4.5", "--profile", "dev",
                       "--regressions-dir", str(tmp_path), "--database", "off"])
    took = time.perf_counter() - started
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sdpa ")]
    assert status == 0 and len(rows) == 3, rows
    assert all(any(c.startswith("time cap") for c in cells(row)) for row in rows), rows
    # 4.5 s of fuzzing plus start-up and the last case of each campaign (a cap is checked
    # between cases), generous for a loaded CI machine; three full caps would be 13.5 s.
    assert 4.5 <= took < 11, took


def test_a_share_is_what_is_left_over_the_campaigns_left():
    from fuzzattn.cli.fuzz import MIN_SHARE, share
    now = time.perf_counter()
    assert share(None, now, 0, 3) is None
    assert share(9.0, now, 0, 3) == 3.0              # the first: an equal part of all of it
    assert 3.9 < share(9.0, now - 1.0, 1, 3) <= 4.0  # 1 s used of its 3: the rest gain it
    assert share(9.0, now - 20.0, 2, 3) == MIN_SHARE  # time spent: the floor, never a negative cap
