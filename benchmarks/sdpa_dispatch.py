"""Which SDPA backend torch's default dispatch picks for a regression file's case, and whether the
forward and backward give finite results under each backend and mask form: the attribution of a
default-dispatch finding that no single-backend implementation reproduces.

    python benchmarks/sdpa_dispatch.py FILE.json [FILE.json ...]      (CUDA)

For each file: the backend `torch._fused_sdp_choice` names for the adapter's arguments (bottom-right
causality as a boolean, then as a float attn_mask; GQA as enable_gqa), then per (backend, mask
form): the forward's max error against the float64 oracle and whether dq, dk, dv are finite.
"""
from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "math": SDPBackend.MATH}


def attribute(path: str, device: str) -> None:
    from fuzzattn.campaigns import regression_file
    from fuzzattn.inputs.materialize import materialize, materialize_dout
    from fuzzattn.judge.oracle import oracle, visible_keys
    case = regression_file.load(path).case
    q, k, v = materialize(case, device).tensors()
    _, dout = materialize_dout(case, device)
    exact = oracle(*(t.cpu() for t in (q, k, v)), case).out
    visible = visible_keys(case.seq_q, case.seq_k, case.causal, device)
    gqa = dict(enable_gqa=True) if case.kv_heads != case.heads else {}
    masks = {"none": None} if visible is None else {
        "bool": visible,
        "float": torch.zeros(visible.shape, dtype=q.dtype, device=device).masked_fill_(~visible, -math.inf)}
    print(f"{Path(path).name}: {case}")
    for form, mask in masks.items():
        try:
            choice = torch._fused_sdp_choice(q, k, v, attn_mask=mask, dropout_p=0.0,
                                             is_causal=False, scale=case.softmax_scale, **gqa)
            print(f"  default dispatch with a {form} mask picks {SDPBackend(choice).name}")
        except Exception as exc:        # a private API: report, do not stop the attribution
            print(f"  default dispatch with a {form} mask: _fused_sdp_choice raised {exc!r:.80}")
        for name, backend in BACKENDS.items():
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with (sdpa_kernel(backend) if backend is not None else torch.enable_grad()):
                        out = F.scaled_dot_product_attention(
                            *leaves, attn_mask=mask, is_causal=False, scale=case.softmax_scale,
                            **gqa)
                        grads = torch.autograd.grad(out, leaves, dout)
                torch.cuda.synchronize() if device == "cuda" else None
            except RuntimeError as exc:
                print(f"    {name:9} {form:5}: {str(exc).splitlines()[0][:90]}")
                continue
            err = (out.detach().double().cpu() - exact).abs().max().item()
            finite = {n: bool(torch.isfinite(g).all()) for n, g in zip(("dq", "dk", "dv"), grads)}
            print(f"    {name:9} {form:5}: out error {err:.3g}; finite "
                  + " ".join(f"{n}={'yes' if ok else 'NO'}" for n, ok in finite.items()))


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for path in sys.argv[1:]:
        attribute(path, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
