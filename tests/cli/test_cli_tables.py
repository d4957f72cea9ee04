"""What the `fuzzattn` command prints: the profile it leaves as it found it, live progress on a
terminal and periodic lines elsewhere, and the JUnit XML and Markdown renderings of outcomes."""
from __future__ import annotations

import io
import os
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest

from fuzzattn import cli
from fuzzattn.campaigns import outcome as report_words
from fuzzattn.cli import tables as report


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("FUZZATTN_REGRESSIONS_DIR", str(tmp_path / "default-fixtures"))
    monkeypatch.delenv("CI", raising=False)


def run(capsys, *argv):
    status = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_main_restores_the_profile(capsys, monkeypatch):
    monkeypatch.setenv("FUZZATTN_PROFILE", "dev")
    run(capsys, "fuzz", "--impl", "sdpa", "--dtype", "float32", "--max-examples", 1,
        "--profile", "ci", "--no-save")
    assert os.environ["FUZZATTN_PROFILE"] == "dev"


def _clock(monkeypatch, start: float = 1000.0) -> list[float]:
    """The progress's clock, moved by hand (now[0] += seconds): what it prints then depends on
    the time the test says passed, not on how loaded the host is. It starts far from 0, as
    perf_counter does, so the first redraw on a terminal is due at once."""
    now = [start]
    monkeypatch.setattr(report, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    return now


def test_progress_is_live_on_a_terminal_and_periodic_lines_elsewhere(monkeypatch):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    now = _clock(monkeypatch)

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    def campaign(progress):
        @settings(max_examples=3, database=None)
        @given(progress.track(st.integers(), "fuzz demo float32", 3, cap=60,
                              counts=lambda: (2, 1, 2)))
        def draw(_):
            now[0] += 0.02                  # each case takes 20 ms
        draw()
        progress.clear()

    stream = Terminal()
    progress = report.Progress(stream=stream)
    assert progress.live
    campaign(progress)
    shown = stream.getvalue()
    assert "\r" in shown and "fuzz demo float32  2/3 cases  2 judged" in shown
    assert "1 refused" in shown and "/60 s" in shown

    monkeypatch.setenv("CI", "true")
    assert not report.Progress(stream=Terminal()).live
    # Not a terminal: whole lines, one per interval (10 s by default; 0.01 s here).
    log = io.StringIO()
    campaign(report.Progress(stream=log, every=0.01))
    lines = log.getvalue().splitlines()
    assert lines and all(line.startswith("fuzz demo float32  2/3 cases") for line in lines)
    assert "\r" not in log.getvalue()
    quiet = io.StringIO()
    campaign(report.Progress(stream=quiet))           # a fast campaign prints no line at all
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("budget, counts, shown", [
    (100, (137, 0, 100), "100/100 cases  137 judged"),     # shrinking judges past the draws
    (100, (101, 0, 101), "100/100 cases  101 judged"),     # a probe's case besides the draws
    (None, (412, 3, 400), "400 cases  412 judged"),        # --seconds alone: no case count
], ids=["shrinking", "probe", "unbounded"])
def test_the_progress_counter_never_passes_its_maximum(budget, counts, shown):
    line = report.Progress._line("fuzz sdpa float32", budget, 60, 11.0, 0, lambda: counts)
    assert line.startswith(f"fuzz sdpa float32  {shown}  "), line
    assert line.endswith("11.0/60 s"), line


def test_a_status_is_a_line_elsewhere_after_a_quiet_interval(monkeypatch):
    """Not a terminal: a status (the gate's 'replay 12/74 FILE') is printed when nothing was for
    an interval (10 s by default), so a long replay shows in a CI log, and not more often."""
    now = _clock(monkeypatch)
    log = io.StringIO()
    progress = report.Progress(stream=log, every=0.5)
    progress.status("replay 1/3 a.json")              # just started: nothing to say yet
    now[0] += 0.6
    progress.status("replay 2/3 b.json")              # quiet for an interval: a line
    now[0] += 0.4
    progress.status("replay 3/3 c.json")              # a line went out 0.4 s ago
    assert log.getvalue() == "replay 2/3 b.json\n"


def test_junit_xml_and_markdown_render_every_outcome():
    outcomes = [report_words.Outcome("replay", "a.json on sdpa", report_words.OK, True, seconds=0.1),
                report_words.Outcome("fuzz", "x float32", report_words.FAIL, False, 7, 1.5,
                               detail="out: B=1 | H=1", message="[FAIL] x out\n  replay: ..."),
                report_words.Outcome("fuzz", "y float32", report_words.SKIP, True, skipped=True, detail="why"),
                report_words.Outcome("mutant", "m", report_words.ERROR, False, detail="broke")]
    root = ET.fromstring(report.junit_xml(outcomes).split("\n", 1)[1])
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == \
        ("4", "1", "1", "1")
    assert root.find(".//failure").text.startswith("[FAIL] x out")
    text = report.markdown(outcomes)
    assert "FAILED" in text and "out: B=1 \\| H=1" in text and "```" in text
    table = report.table(("a", "b"), [["1", "x" * 200]], max_width=20)
    assert max(len(line) for line in table.splitlines()) < 30



def test_time_caps_read_as_a_person_writes_them():
    assert [report.seconds_text(s) for s in (0.2, 1, 5.26341, 60.0, 3600)] == [
        "0.2", "1", "5.26", "60", "3600"]


def _gate_outcomes() -> list:
    from fuzzattn.campaigns.outcome import FAIL, OK, SKIP, XFAIL, Outcome
    clean = [Outcome("replay", f"{i:012x}.json on {impl}", OK, True)
             for impl, n in (("triton_fa2", 41), ("sdpa", 2)) for i in range(n)]
    return clean + [
        Outcome("replay", "bad.json on sdpa", FAIL, False, detail="out error=3 allowed=1"),
        Outcome("replay", "cudnn.json on sdpa_cudnn", XFAIL, True, detail="known upstream"),
        Outcome("replay", "odd.json", SKIP, True, skipped=True, detail="no implementation declares it"),
        Outcome("fuzz", "sdpa float32", OK, True, 60, 1.0)]


def test_the_gate_table_lists_what_needs_eyes_and_counts_the_clean_replays():
    text = report.gate_table(_gate_outcomes())
    rows = [line for line in text.splitlines() if line.startswith(("replay", "fuzz"))]
    assert [row.split()[1] for row in rows] == ["bad.json", "cudnn.json", "odd.json", "sdpa"], text
    assert text.splitlines()[-2:] == ["triton_fa2: 41 files replayed clean",
                                      "sdpa: 2 files replayed clean"], text
    assert not any(" ok " in row for row in rows if row.startswith("replay")), text


def test_the_verbose_gate_table_has_every_row():
    text = report.gate_table(_gate_outcomes(), verbose=True)
    assert sum(line.startswith("replay") for line in text.splitlines()) == 46, text
    assert "replayed clean" not in text
    args = cli.build_parser().parse_args(["gate", "-v"])
    assert args.verbose and not cli.build_parser().parse_args(["gate"]).verbose
