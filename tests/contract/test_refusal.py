"""Inputs an implementation does not declare are refused with a clear error, not answered."""
import pytest
from hypothesis import given, settings, strategies as st

from fuzzattn import AttentionCase, Capabilities, Implementation
from fuzzattn.judgement.judge import check_refusal, refusal_not_applicable
from fuzzattn.settings import implementations as all_implementations
from fuzzattn.kernels.sdpa import sdpa_forward
from fuzzattn.strategies import undeclared_cases


# A backend-restricted SDPA (sdpa_flash) explains in UserWarnings why torch's kernel refuses the
# inputs before it raises; the raised refusal is what is judged, the warnings are torch's chatter.
@pytest.mark.filterwarnings("ignore:Flash attention kernel not used:UserWarning")
@pytest.mark.filterwarnings("ignore:All fused kernels require:UserWarning")
@pytest.mark.parametrize("impl", all_implementations(), ids=lambda impl: impl.name)
@settings(max_examples=40)
@given(data=st.data())
def test_undeclared_inputs_are_refused_in_one_line(impl, data):
    if refusal_not_applicable(impl):
        pytest.skip(refusal_not_applicable(impl))
    what, case = data.draw(undeclared_cases(impl.caps), label="undeclared")
    verdict = check_refusal(impl, case)
    assert verdict.passed, verdict.headline()
    assert "\n" not in verdict.detail


def test_an_implementation_answering_undeclared_inputs_is_caught():
    # declares fp32 only, but happily answers bf16: whatever it returns is unvetted
    lax = Implementation("lax", sdpa_forward, Capabilities(dtypes={"float32"}))
    case = AttentionCase(1, 1, 1, 4, 4, 16, dtype="bfloat16")
    verdict = check_refusal(lax, case)
    assert not verdict.passed
    assert "answered dtype=bfloat16" in verdict.detail


def test_a_silent_refusal_is_not_clear_enough():
    def silent(q, k, v, *, causal, scale):
        if q.dtype != __import__("torch").float32:
            raise ValueError()
        return sdpa_forward(q, k, v, causal=causal, scale=scale)

    verdict = check_refusal(Implementation("silent", silent, Capabilities(dtypes={"float32"})),
                            AttentionCase(1, 1, 1, 4, 4, 16, dtype="bfloat16"))
    assert not verdict.passed and "empty ValueError" in verdict.detail


PLAIN_KERNEL = '''
import torch.nn.functional as F


def attention(q, k, v, *, causal, scale):
    # treats any causal value as top-left: answers bottom_right instead of refusing it
    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), scale=scale)
'''


def test_the_refusal_rule_for_plain_callables(tmp_path):
    """A plain callable declared nothing, so the refusal property does not apply to it; the same
    callable wrapped in an Implementation that declares top-left only must refuse."""
    from fuzzattn.run.loader import load_implementation
    path = tmp_path / "plain_kernel.py"
    path.write_text(PLAIN_KERNEL)
    plain = load_implementation(f"{path}:attention")
    assert not plain.declares
    case = AttentionCase(1, 1, 1, 4, 2, 16, causal="bottom_right")
    assert "plain callable" in refusal_not_applicable(plain)
    with pytest.raises(ValueError, match="declared no capabilities"):
        check_refusal(plain, case)
    declared = Implementation("declared", plain.fn, Capabilities())
    assert refusal_not_applicable(declared) is None
    verdict = check_refusal(declared, case)
    assert not verdict.passed and "instead of refusing" in verdict.detail
