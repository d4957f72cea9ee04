"""SDPA's known upstream defects on CUDA (fuzzattn.contract.known_defects), by implementation.

Each was found by a GPU campaign (benchmarks/REPORT.md), located with `fuzzattn
explain`, and is pinned by the regression files named here, whose `expected_failures` entries
say what fails and where to report it. The predicates are the input classes those explanations
measured, no wider. Each names the check its file records: a campaign on CUDA judges these
cases, tallies a failure of that check to the defect (never a pass, never shrunk again) and
reports any other failure as a finding; the backward's device fault would poison the
campaign's CUDA context, so unless judged isolated its cases are judged without gradients. The
files still replay them, XFAIL until fixed.
"""
from __future__ import annotations

from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.known_defects import KnownDefect


def _masked_with_stride0_kv_heads(case: AttentionCase) -> bool:
    """Causal (a mask or is_causal reaches the kernel) with k or v expanded over its heads."""
    return case.causal != "none" and "broadcast_heads" in case.layout[1:]


def _float_mask_fp32_stride0(case: AttentionCase) -> bool:
    """sdpa_window: causality or a window reaches EFFICIENT_ATTENTION (fp32's default dispatch)
    as a float mask, with k or v expanded over its heads."""
    return (case.dtype == "float32" and (case.causal != "none" or case.windowed)
            and "broadcast_heads" in case.layout[1:])


def _efficient_fp32(case: AttentionCase) -> bool:
    """Default dispatch picks EFFICIENT_ATTENTION for fp32 on CUDA."""
    return case.dtype == "float32" and _masked_with_stride0_kv_heads(case)


def _boolean_bottom_right(case: AttentionCase) -> bool:
    """Bottom-right causal reaches cuDNN as a boolean mask (the form's default)."""
    return case.causal == "bottom_right" and case.config_dict.get("mask_form", "bool") == "bool"


def _half_boolean_bottom_right(case: AttentionCase) -> bool:
    """Default dispatch picks cuDNN for bf16/fp16 with a mask on CUDA; `sdpa` passes bool."""
    return case.dtype in ("bfloat16", "float16") and case.causal == "bottom_right"


def _unaligned_rows(case: AttentionCase) -> bool:
    """The sliced layout: row stride D + 3 elements, so rows are not 16-byte aligned."""
    return "sliced" in case.layout


def _bf16_gqa_large_bottom_right(case: AttentionCase) -> bool:
    return (case.dtype == "bfloat16" and case.causal == "bottom_right"
            and case.kv_heads < case.heads and case.values == "large")


def _bf16_far_below_zero_unmasked(case: AttentionCase) -> bool:
    """Default dispatch picks cuDNN for bf16 without a mask; values=below_sentinel puts every
    score near -1e8 (measured with causal none only)."""
    return (case.dtype == "bfloat16" and case.causal == "none"
            and case.values == "below_sentinel")


def _bf16_far_below_zero_unwindowed(case: AttentionCase) -> bool:
    """The same on sdpa_varlen, whose windows are masks: measured without a window, without
    causality (its file) and top-left (explaining f65d7ad72b84.json in bf16)."""
    return (case.dtype == "bfloat16" and case.causal in ("none", "top_left")
            and case.values == "below_sentinel" and not case.windowed)


def _half_bottom_right_empty_rows(case: AttentionCase) -> bool:
    """bf16/fp16 bottom-right with Nq > Nk: the first Nq - Nk rows see no key."""
    return (case.dtype in ("bfloat16", "float16") and case.causal == "bottom_right"
            and case.seq_q > case.seq_k)


def _fp16_bottom_right_custom_scale(case: AttentionCase) -> bool:
    """fp16 bottom-right with a scale of the caller's (what the shrunk case's factors needed)."""
    return case.dtype == "float16" and case.causal == "bottom_right" and case.scale is not None


def _half_causal_large(case: AttentionCase) -> bool:
    """bf16/fp16 under a causal float mask with values=large: what explaining the file measured
    (either alignment, Nq > Nk or not, any layout, with or without GQA; no mask passes)."""
    return (case.dtype in ("bfloat16", "float16") and case.causal != "none"
            and case.values == "large")


def _fp16_causal_sentinel_sweep(case: AttentionCase) -> bool:
    """The same class with values=sentinel_sweep (scores up to 1e13), measured in fp16."""
    return (case.dtype == "float16" and case.causal != "none"
            and case.values == "sentinel_sweep")


def _unbiased(predicate):
    """The predicate on sdpa_alibi, whose biased calls are made on float32 copies: its cases
    without ALiBi make sdpa_window's call."""
    return lambda case: predicate(case) and not case.alibi


def _fp16_top_left_below_sentinel(case: AttentionCase) -> bool:
    """fp16, top-left causal, every score near -1e8 (values=below_sentinel): the explained file."""
    return (case.dtype == "float16" and case.causal == "top_left"
            and case.values == "below_sentinel")


def _fp16_top_left_custom_scale_empty_sequence(case: AttentionCase) -> bool:
    """fp16, top-left, a scale of the caller's, a sequence with no keys among several: the
    explained file's factors (its values did not matter)."""
    return (case.dtype == "float16" and case.causal == "top_left" and case.scale is not None
            and 0 in case.seqlens_k and len(case.seqlens_k) > 1)


def _fp16_near_constant_custom_scale(case: AttentionCase) -> bool:
    """fp16, values=near_constant and a scale of the caller's: the three factors both measured
    cases needed (one with GQA and two sequences, one with neither; the explained one passed
    without GQA or with either sequence alone, which changes its values too)."""
    return (case.dtype == "float16" and case.values == "near_constant"
            and case.scale is not None)


_EFFICIENT_STRIDE0 = "EFFICIENT_ATTENTION: wrong rows with a mask and stride-0 k/v heads"
_CUDNN_LEAK = "CUDNN_ATTENTION: a boolean mask lets a masked key through"
_MISALIGNED = "backward faults (misaligned address) on rows not 16-byte aligned"
_HALF_CAUSAL_LARGE = ("backward: inf dq, bf16/fp16 under a causal float mask, large scores "
                      "(default dispatch; cuDNN and math forced pass)")

KNOWN_DEFECTS: dict[str, tuple[KnownDefect, ...]] = {
    "sdpa_efficient": (
        KnownDefect(_EFFICIENT_STRIDE0, "cuda", _masked_with_stride0_kv_heads, "b72a48d1a5d8.json", check="out"),
    ),
    "sdpa_cudnn": (
        KnownDefect(_CUDNN_LEAK, "cuda", _boolean_bottom_right, "6b568ee594f6.json", check="out"),
    ),
    "sdpa": (
        KnownDefect(_EFFICIENT_STRIDE0 + " (fp32 dispatch)", "cuda", _efficient_fp32,
                    "3b46e3e5e539.json", check="out"),
        KnownDefect(_CUDNN_LEAK + " (bf16/fp16 dispatch)", "cuda", _half_boolean_bottom_right,
                    "95f075a17216.json", check="out"),
        KnownDefect(_MISALIGNED, "cuda", _unaligned_rows, "e9ea361b7922.json", backward=True,
                    check="device_fault"),
        KnownDefect("CUDNN_ATTENTION backward: NaN dq, bf16 GQA bottom-right, large scores", "cuda",
                    _bf16_gqa_large_bottom_right, "439ea7a26107.json", backward=True,
                    check="grad_nonfinite"),
        KnownDefect("CUDNN_ATTENTION backward: inf dq, bf16 without a mask, scores near -1e8",
                    "cuda", _bf16_far_below_zero_unmasked, "879cc64f812c.json", backward=True,
                    check="grad_nonfinite"),
        KnownDefect("backward: NaN dq on rows with no visible key, bf16/fp16 bottom-right Nq > Nk",
                    "cuda", _half_bottom_right_empty_rows, "a63a1280a707.json", backward=True,
                    check="grad_nonfinite"),
        KnownDefect("backward: NaN dq on a row that sees one key, fp16 bottom-right, custom scale",
                    "cuda", _fp16_bottom_right_custom_scale, "9330b9e5f2b4.json", backward=True,
                    check="grad_nonfinite"),
    ),
    "sdpa_window": (
        KnownDefect(_EFFICIENT_STRIDE0 + " (fp32 dispatch)", "cuda", _float_mask_fp32_stride0,
                    "3b46e3e5e539.json", check="out"),
        KnownDefect(_MISALIGNED, "cuda", _unaligned_rows, "e9ea361b7922.json", backward=True,
                    check="device_fault"),
        KnownDefect(_HALF_CAUSAL_LARGE, "cuda", _half_causal_large, "1c90478d5144.json",
                    backward=True, check="grad_nonfinite"),
        KnownDefect(_HALF_CAUSAL_LARGE, "cuda", _fp16_causal_sentinel_sweep, "789cff29fc89.json",
                    backward=True, check="grad_nonfinite"),
    ),
    "sdpa_alibi": (
        KnownDefect(_EFFICIENT_STRIDE0 + " (fp32 dispatch)", "cuda",
                    _unbiased(_float_mask_fp32_stride0), "3b46e3e5e539.json", check="out"),
        KnownDefect(_MISALIGNED, "cuda", _unaligned_rows, "446bf219443a.json", backward=True,
                    check="device_fault"),
        KnownDefect(_HALF_CAUSAL_LARGE, "cuda", _unbiased(_half_causal_large), "1c90478d5144.json",
                    backward=True, check="grad_nonfinite"),
        KnownDefect(_HALF_CAUSAL_LARGE, "cuda", _unbiased(_fp16_causal_sentinel_sweep),
                    "789cff29fc89.json", backward=True, check="grad_nonfinite"),
    ),
    "sdpa_varlen": (
        KnownDefect("backward: inf dq, bf16, scores near -1e8, unmasked or top-left", "cuda",
                    _bf16_far_below_zero_unwindowed, "0a15d32e3a6d.json",
                    backward=True, check="grad_nonfinite"),
        KnownDefect("backward: dk, dv on keys no query sees, fp16 top-left float mask, scores "
                    "near -1e8", "cuda", _fp16_top_left_below_sentinel, "f65d7ad72b84.json",
                    backward=True, check="grad_empty_rows"),
        KnownDefect("backward: inf dq, dk, dv, fp16 near-constant values with a custom scale",
                    "cuda", _fp16_near_constant_custom_scale, "248883c2d64e.json",
                    backward=True, check="grad_nonfinite"),
        KnownDefect("backward: inf dq, fp16 top-left with a custom scale, a sequence with no keys",
                    "cuda", _fp16_top_left_custom_scale_empty_sequence, "66ad3d475eba.json",
                    backward=True, check="grad_nonfinite"),
    ),
}
