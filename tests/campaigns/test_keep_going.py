"""Campaigns that keep going after a counterexample (campaigns/defects.py): every distinct defect
once, shrunk and saved; later failures of a known defect tallied to it; the load probe's failing
case judged and saved as the first counterexample."""
from __future__ import annotations

from pathlib import Path

from fuzzattn import AttentionCase, cli
from fuzzattn.campaigns.campaign import fuzz
from fuzzattn.campaigns.defects import DefectBook, check_key, factors
from fuzzattn.campaigns.found import Counterexample
from fuzzattn.judgement.judge import JudgedCase
from fuzzattn.judging.verdict import Verdict
from fuzzattn.run.loader import load_implementation
from fuzzattn.strategies.cases import attention_cases

import pruning_kernels as pk

KERNELS = Path(__file__).resolve().parents[1] / "pruning_kernels.py"


def failed(case: AttentionCase, check: str, detail: str = "") -> JudgedCase:
    return JudgedCase("k", case, [Verdict("k", case, check, False, detail=detail)])


def plain(**kw) -> AttentionCase:
    return AttentionCase(**{**dict(batch=1, heads=1, kv_heads=1, seq_q=4, seq_k=4,
                                   head_dim=16), **kw})


def test_the_check_key_names_the_crash_type():
    assert check_key(failed(plain(), "out")) == "out"
    assert check_key(failed(plain(), "crash", "IndexError: list index")) == "crash: IndexError"
    assert check_key(failed(plain(), "crash", "second run: compile error: CompilationError: "
                                              "at 1:2 (compiler output: x)")) == \
        "crash: compile error: CompilationError"


def test_a_failure_belongs_to_the_most_specific_defect_whose_factors_it_has():
    caps = pk.TWO_BUGS.caps
    book = DefectBook(caps)
    general = failed(plain(), "out")
    bottom_right = failed(plain(causal="bottom_right", seq_q=5, seq_k=4), "out")
    # each factor made plain still fails the same way: nothing is needed
    book.add(Counterexample(general, None), lambda c, gradients: general)
    # the bottom-right case passes once made plain in either factor: both are needed
    book.add(Counterexample(bottom_right, None),
             lambda c, gradients: JudgedCase("k", c, []))
    assert [d.needs() for d in book.defects] == ["nothing special",
                                                 "causal=bottom_right lengths=Nq>Nk"]
    assert book.owner(failed(plain(causal="bottom_right", seq_q=9, seq_k=2, values="large"),
                             "out")) is book.defects[1]
    assert book.owner(failed(plain(causal="top_left"), "out")) is book.defects[0]
    assert book.owner(failed(plain(), "lse")) is None
    assert factors(plain(causal="top_left", seq_q=1), caps) == {"causal": "top_left",
                                                                 "lengths": "Nq<Nk"}


def test_factor_values_match_by_class_configuration_axes_and_sentinel_profiles():
    """A tile bug needing BLOCK_M off its first choice owns a failure at any other BLOCK_M; a
    sentinel bug found through below_sentinel owns one met through sentinel_sweep, not one
    through large values; a bottom-right bug does not own a top-left failure."""
    import dataclasses
    caps = dataclasses.replace(pk.TWO_BUGS.caps, configs=(("BLOCK_M", (16, 32, 64)),))
    book = DefectBook(caps)
    passes = lambda c, gradients: JudgedCase("k", c, [])  # noqa: E731  every factor is needed
    tile = failed(plain(config=(("BLOCK_M", 32),)), "out")
    sentinel = failed(plain(values="below_sentinel"), "lse")
    bottom_right = failed(plain(causal="bottom_right"), "nonfinite")
    for judged in (tile, sentinel, bottom_right):
        book.add(Counterexample(judged, None), passes)
    assert [d.needs() for d in book.defects] == ["BLOCK_M=32", "values=below_sentinel",
                                                 "causal=bottom_right"]
    assert book.owner(failed(plain(config=(("BLOCK_M", 64),)), "out")) is book.defects[0]
    assert book.owner(failed(plain(config=(("BLOCK_M", 16),)), "out")) is None
    assert book.owner(failed(plain(values="sentinel_sweep"), "lse")) is book.defects[1]
    assert book.owner(failed(plain(values="large"), "lse")) is None
    assert book.owner(failed(plain(causal="top_left"), "nonfinite")) is None
    # a second shrink that ends at another tile of the same axis is the same defect, tallied
    again = book.add(Counterexample(failed(plain(config=(("BLOCK_M", 64),)), "out"), None), passes)
    assert again is book.defects[0] and again.hits == 2 and len(book) == 3


def test_a_bug_of_both_alignments_is_one_defect_and_a_bug_of_one_stays_its_own():
    caps = pk.TWO_BUGS.caps
    book = DefectBook(caps)
    chunk = failed(plain(causal="top_left", seq_q=3, seq_k=9), "out")
    # fails with either mask, passes without one or with equal lengths
    masked_and_unequal = lambda c, gradients: (  # noqa: E731
        failed(c, "out") if c.causal != "none" and c.seq_q < c.seq_k else JudgedCase("k", c, []))
    book.add(Counterexample(chunk, None), masked_and_unequal)
    assert book.defects[0].needs() == "causal=either lengths=Nq<Nk"
    assert book.owner(failed(plain(causal="bottom_right", seq_q=2, seq_k=7), "out")) \
        is book.defects[0]
    assert book.owner(failed(plain(seq_q=2, seq_k=7), "out")) is None      # no mask
    # a bottom-right-only bug (top-left passes): its alignment is needed, and it is a second defect
    only_bottom_right = lambda c, gradients: (  # noqa: E731
        failed(c, "lse") if c.causal == "bottom_right" and c.seq_q > c.seq_k
        else JudgedCase("k", c, []))
    book.add(Counterexample(failed(plain(causal="bottom_right", seq_q=5, seq_k=3), "lse"), None),
             only_bottom_right)
    assert book.defects[1].needs() == "causal=bottom_right lengths=Nq>Nk"
    assert book.owner(failed(plain(causal="top_left", seq_q=5, seq_k=3), "lse")) is None


def test_two_seeded_bugs_in_one_kernel_are_distinct_defects_in_one_run():
    result = fuzz(pk.TWO_BUGS, attention_cases(pk.TWO_BUGS.caps), max_examples=120,
                  save_to_file=False, stop_at_first=False, seconds=240)
    found = [(d.check_key, d.needs(), str(d.judged.case)) for d in result.defects]
    # no safe max: NaN (or non-zero) rows where bottom-right leaves a row no key
    empty = [d for d in result.defects if d.check_key in ("nonfinite", "empty_rows")]
    assert len(empty) == 1, found
    assert empty[0].factors.get("causal") == "bottom_right", found
    assert empty[0].factors.get("lengths") == "Nq>Nk" and empty[0].hits > 1, found
    # chunks aligned to the wrong end: wrong values where 1 < Nq < Nk, whichever the alignment
    chunks = [d for d in result.defects if d.check_key == "out"]
    assert len(chunks) == 1, found
    assert chunks[0].factors == {"causal": "either", "lengths": "Nq<Nk"}, found
    assert 1 < chunks[0].judged.case.seq_q < chunks[0].judged.case.seq_k, found
    assert len(result.defects) == len(empty) + len(chunks), found
    assert result.counterexample is result.defects[0].counterexample


def test_one_bug_hit_by_many_cases_is_one_defect_with_its_count():
    result = fuzz(pk.ONE_BUG, attention_cases(pk.ONE_BUG.caps), max_examples=80,
                  save_to_file=False, stop_at_first=False, seconds=180)
    assert len(result.defects) == 1, [(d.check_key, d.needs()) for d in result.defects]
    defect = result.defects[0]
    assert defect.hits > 1 and defect.shrunk
    assert defect.factors.get("causal") == "bottom_right"
    first = fuzz(pk.ONE_BUG, attention_cases(pk.ONE_BUG.caps), max_examples=80,
                 save_to_file=False, seconds=180)          # stop_at_first by default
    assert len(first.defects) == 1 and first.cases < result.cases


def test_fuzz_command_lists_each_defect_with_its_hits(capsys, tmp_path):
    status = cli.main(["fuzz", "--impl", f"{KERNELS}:TWO_BUGS", "--max-examples", "120",
                       "--seconds", "240", "--regressions-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 1, out
    table = out.split("defects by cause")[1].split("\n\n")[0]
    rows = [line for line in table.splitlines()[3:] if line.strip()]
    assert len(rows) >= 2, out
    assert out.count("cases hit:") == len(rows)
    assert len(list(tmp_path.glob("*.json"))) == len(rows), out


def test_a_failing_probe_is_the_first_counterexample_saved_and_replayable(capsys, tmp_path):
    impl = load_implementation(f"{KERNELS}:fails_on_16")
    assert impl.probe_case is not None and impl.probe_case.seq_k == 16
    status = cli.main(["fuzz", "--impl", f"{KERNELS}:fails_on_16", "--dtype", "float32",
                       "--max-examples", "10", "--regressions-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 1, out
    assert "kernel launch failed for 16 keys" in out
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1, out
    assert "Nk=16" in out and "replay:" in out
    # the rest of the campaign still ran
    assert "| 10 " in out or " 10 " in out.split("shrunk case")[1].splitlines()[2], out
    assert cli.main(["replay", str(files[0]), "--impl", f"{KERNELS}:fails_on_16"]) == 1


def test_a_kernel_that_cannot_be_called_is_still_a_load_error(capsys):
    status = cli.main(["fuzz", "--impl", f"{KERNELS}:wrong_signature", "--max-examples", "1"])
    err = capsys.readouterr().err
    assert status == 2
    assert "wrong_signature cannot be called as fn(q, k, v, causal=..., scale=...)" in err


def test_stop_at_first_keeps_one_counterexample_per_campaign(capsys, tmp_path):
    status = cli.main(["fuzz", "--impl", f"{KERNELS}:TWO_BUGS", "--max-examples", "120",
                       "--stop-at-first", "--regressions-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 1, out
    assert len(list(tmp_path.glob("*.json"))) == 1, out
    assert out.count("cases hit:") == 1 and "--stop-at-first" in out     # in "found by"


def test_an_isolated_probe_that_raises_also_hands_its_case_to_the_campaign():
    from fuzzattn.isolation.pool import load_isolated
    impl = load_isolated(f"{KERNELS}:fails_on_16", timeout=60)
    assert impl.probe_case is not None and impl.probe_case.seq_k == 16
    assert impl.caps.returns_lse is False       # a plain callable whose probe raised
