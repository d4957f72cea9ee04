"""A cause's own shrink (fuzzattn/campaigns/cause_shrink.py): a defect reported as drawn or cut
short is shrunk holding to its cause, never drifting to another bug the case also holds."""
from __future__ import annotations

import functools

from hypothesis import strategies as st

from fuzzattn import Capabilities
from fuzzattn.campaigns.campaign import fuzz, judge_once
from fuzzattn.campaigns.cause_shrink import candidates, shrink_cause
from fuzzattn.campaigns.defects import DefectBook
from fuzzattn.campaigns.found import Counterexample
from fuzzattn.contract.case import AttentionCase

from examples.two_bug_attention import TWO_BUGS

# Both causes of the example at once: an odd Nk, and V laid out apart from K.
DRAWN = AttentionCase(batch=3, heads=4, kv_heads=4, seq_q=41, seq_k=41, head_dim=16,
                      layout=("contiguous", "contiguous", "transposed"), data_seed=77)


MULTI_DTYPE = Capabilities(dtypes={"float32", "float16"}, head_dims={8, 16}, causal=())


def _judge(case, gradients=False):
    return judge_once(TWO_BUGS, case, gradients=gradients)


def _book_with(case):
    book = DefectBook(TWO_BUGS.caps, _judge)
    defect = book.add(Counterexample(_judge(case), None), _judge)
    return book, defect


def test_candidates_are_declared_one_step_simplifications():
    steps = candidates(DRAWN, TWO_BUGS.caps)
    assert steps and DRAWN not in steps
    for step in steps:
        assert TWO_BUGS.caps.why_not(step) is None
        changed = [f for f in ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim",
                               "layout", "data_seed") if getattr(step, f) != getattr(DRAWN, f)]
        assert changed, step
    assert any(s.head_dim == 8 for s in steps) and any(s.data_seed == 0 for s in steps)
    # a campaign draws one dtype: its cause's shrink keeps it
    half = DRAWN.replace(dtype="float16")
    assert all(s.dtype == "float16" for s in candidates(half, MULTI_DTYPE))


def test_a_cause_shrinks_to_its_smallest_case_and_keeps_its_trigger():
    odd = DRAWN.replace(layout=("contiguous",) * 3)
    book, defect = _book_with(odd)
    assert defect.needs() == "Nk odd"
    result = shrink_cause(defect.judged, functools.partial(book.holds, defect),
                          _judge, TWO_BUGS.caps, seconds=None)
    assert result.complete and not result.note(odd)
    case = result.judged.case
    assert (case.batch, case.heads, case.head_dim, case.data_seed) == (1, 1, 8, 0), case
    assert case.seq_k % 2 == 1 and case.seq_k <= 3 and case.seq_q <= 3, case
    assert not result.judged.passed


def test_a_shrink_holding_to_one_cause_sheds_the_other():
    book, stride = _book_with(DRAWN.replace(seq_k=40, seq_q=40))
    assert "layout[k]≠layout[v]" in stride.needs()
    _, odd = _book_with(DRAWN.replace(layout=("contiguous",) * 3))
    book.defects.append(odd)
    # the drawn case holds both bugs; the stride cause's shrink must keep V apart from K
    # and end on an even Nk (an odd one would also be the other cause's)
    result = shrink_cause(_judge(DRAWN), functools.partial(book.holds, stride),
                          _judge, TWO_BUGS.caps, seconds=None)
    case = result.judged.case
    assert case.layout[1] != case.layout[2], case
    assert book.holds(stride, result.judged)
    assert case.seq_k % 2 == 0 and case.batch == 1, case
    # H=1 would hide it: transposed and contiguous strides differ only across heads
    assert case.heads == 2, case


def test_a_budget_cut_says_how_far_it_got():
    book, defect = _book_with(DRAWN.replace(layout=("contiguous",) * 3))
    result = shrink_cause(defect.judged, functools.partial(book.holds, defect),
                          _judge, TWO_BUGS.caps, seconds=None, max_judged=2)
    assert not result.complete
    assert "shrink cut short after 2 judged cases" in result.note(defect.judged.case)
    assert "Nk=41" in result.note(defect.judged.case)


def test_a_campaigns_case_saved_as_drawn_is_shrunk_before_it_is_reported(tmp_path):
    # the draws never fail (even Nk, one layout); the first case, judged before any draw as
    # the load probe's is, fails through the odd Nk and was once reported as drawn
    plain = st.builds(AttentionCase, batch=st.just(1), heads=st.just(1), kv_heads=st.just(1),
                      seq_q=st.sampled_from([2, 4]), seq_k=st.sampled_from([2, 4]),
                      head_dim=st.just(8))
    first = DRAWN.replace(layout=("contiguous",) * 3)
    found = fuzz(TWO_BUGS, plain, max_examples=20, first_cases=[first], stop_at_first=False,
                 regressions_dir=tmp_path, hypothesis_seed_value=0)
    (defect,) = found.defects
    assert defect.shrunk and not defect.shrink_note
    case = defect.judged.case
    assert case.batch == 1 and case.seq_k <= 3, case
    files = list(tmp_path.glob("*.json"))
    assert [p.name for p in files] == [f"{case.key()}.json"], files
