"""Rows of several workers merged by cause (fuzzattn/cli/merged.py): a worker's row that is a
mixture of causes other workers found (the union of their triggers, or nothing needed where no
single undo cured it) is folded into them, and its file removed; a row of its own stays."""
from __future__ import annotations

import types

from fuzzattn import Capabilities
from fuzzattn.campaigns.defects import Defect
from fuzzattn.campaigns.regression_file import Written
from fuzzattn.cli.merged import _fold_mixtures
from fuzzattn.contract.case import AttentionCase

CAPS = Capabilities(dtypes={"float16"}, head_dims={16}, causal=("top_left",),
                    configs={"BLOCK_M": (16, 32, 64)})
PLAIN = AttentionCase(1, 1, 1, 1, 1, 16, dtype="float16")


def _row(tmp_path, case, trigger, hits=1):
    path = tmp_path / f"{case.key()}.json"
    path.write_text("{}")
    found = types.SimpleNamespace(judged=types.SimpleNamespace(case=case),
                                  written=Written(path, new=True))
    return (found, Defect(found, "out", frozenset({"out"}), trigger, hits=hits), "")


def test_a_union_of_two_triggers_and_a_case_needing_nothing_are_folded(tmp_path):
    lengths = _row(tmp_path, PLAIN.replace(seq_q=2), {"lengths": "Nq>Nk"}, hits=200)
    sentinel = _row(tmp_path, PLAIN.replace(values="below_sentinel"), {"values": "below_sentinel"})
    mask = _row(tmp_path, PLAIN.replace(seq_q=17, seq_k=17, causal="top_left",
                                        config=(("BLOCK_M", 32),)),
                {"causal": "top_left", "BLOCK_M": "32"}, hits=40)
    union = _row(tmp_path, PLAIN.replace(seq_q=2, values="below_sentinel"),
                 {"values": "below_sentinel", "lengths": "Nq>Nk"}, hits=2)
    # BLOCK_M=64 is the mask row's class (off its first choice): a union all the same
    wider = _row(tmp_path, PLAIN.replace(seq_q=17, seq_k=1, causal="top_left",
                                         config=(("BLOCK_M", 64),)),
                 {"causal": "top_left", "lengths": "Nq>Nk", "BLOCK_M": "64"}, hits=3)
    nothing = _row(tmp_path, PLAIN.replace(seq_q=18, seq_k=17, causal="top_left",
                                           config=(("BLOCK_M", 32),)), {}, hits=5)
    rows = [lengths, sentinel, mask, union, wider, nothing]
    kept = _fold_mixtures(rows, CAPS)
    assert [r[1].needs() for r in kept] == [
        "lengths=Nq>Nk", "values=below_sentinel", "causal=top_left BLOCK_M=32"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        r[0].written.path.name for r in kept)
    assert sum(r[1].hits for r in kept) == 200 + 1 + 40 + 2 + 3 + 5


def test_a_row_that_is_not_made_of_others_stays(tmp_path):
    lengths = _row(tmp_path, PLAIN.replace(seq_q=2), {"lengths": "Nq>Nk"})
    sentinel = _row(tmp_path, PLAIN.replace(values="below_sentinel"), {"values": "below_sentinel"})
    # needs more than the two together: its own cause
    more = _row(tmp_path, PLAIN.replace(seq_q=2, values="below_sentinel", causal="top_left"),
                {"values": "below_sentinel", "lengths": "Nq>Nk", "causal": "top_left"})
    # needs nothing, holds one other row's trigger but fails another check: a plain bug
    plain = _row(tmp_path, PLAIN.replace(seq_q=2, data_seed=3), {})
    plain[1].check_key, plain[1].checks = "nonfinite", ["nonfinite"]
    kept = _fold_mixtures([lengths, sentinel, more, plain], CAPS)
    assert len(kept) == 4 and len(list(tmp_path.iterdir())) == 4


def test_a_plain_row_holding_one_causes_trigger_and_symptom_is_that_cause(tmp_path):
    # a nondeterministic kernel's case whose cure test did not hold: it needs "nothing", yet
    # holds the lengths cause's trigger and fails its check
    lengths = _row(tmp_path, PLAIN.replace(seq_q=2, causal="top_left"), {"lengths": "Nq>Nk"})
    lengths[1].checks = ["unwritten_output"]
    racy = _row(tmp_path, PLAIN.replace(seq_q=2, data_seed=1), {}, hits=149)
    racy[1].check_key, racy[1].checks = "unwritten_output", ["unwritten_output", "out"]
    # needing nothing with another check: a plain bug of its own
    other = _row(tmp_path, PLAIN.replace(seq_q=2, data_seed=2), {})
    kept = _fold_mixtures([lengths, racy, other], CAPS)
    assert [r[1] for r in kept] == [lengths[1], other[1]]
    assert lengths[1].hits == 150 and not racy[0].written.path.exists()
