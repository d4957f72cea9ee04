"""Raw values behind a nonfinite finding: per query row, the kernel's lse and out beside the
float64 oracle's, for the recorded case and for variants of it (one factor changed at a time).

`fuzzattn explain` says which factors flip the verdict; this says what the kernel returned: an lse
that is finite next to an out that is inf points at the accumulator or its normalisation, an lse
that is NaN or inf at the running max or the row sum.

    python benchmarks/probe_rows.py regressions/0763cfda3c65.json \
        --vary BLOCK_N=32 --vary scale=none --vary dtype=bfloat16

Backward configuration keys (bwd_) are dropped: this probes the forward. Runs wherever the
implementation runs (the interpreter on the CPU, compiled on a GPU).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import fuzzattn  # noqa: E402,F401  (selects the backend before triton loads)
from fuzzattn.contract.case import AttentionCase  # noqa: E402
from fuzzattn.run import registry  # noqa: E402
from fuzzattn.inputs.materialize import materialize  # noqa: E402
from fuzzattn.judge.judge import default_device  # noqa: E402
from fuzzattn.judge.oracle import oracle  # noqa: E402


def _variant(case: AttentionCase, change: str) -> AttentionCase:
    """`case` with one `NAME=VALUE` change: a configuration key, or a case field."""
    name, _, text = change.partition("=")
    value = None if text == "none" else int(text) if text.lstrip("-").isdigit() else \
        float(text) if text.replace(".", "", 1).isdigit() else text
    config = dict(case.config)
    if name in config:
        config[name] = value
        return case.replace(config=tuple(sorted(config.items())))
    return case.replace(**{name: value})


def _rows(impl, case: AttentionCase, device: str, rows: int) -> list[str]:
    inputs = materialize(case, device)
    out, lse = impl(*inputs.tensors(), case)
    ref = oracle(*inputs.on(torch.device("cpu")).tensors(), case)
    out, lse = out.detach().cpu().double(), lse.detach().cpu().double()
    lines = []
    for h in range(case.heads):
        for i in range(min(rows, case.seq_q)):
            got, want = out[0, h, i], ref.out[0, h, i]
            lines.append(f"  h{h} row {i:3d}: lse {lse[0, h, i].item():+.6e} (oracle "
                         f"{ref.lse[0, h, i].item():+.6e})  out[:4] "
                         f"{[round(x, 4) for x in got[:4].tolist()]} (oracle "
                         f"{[round(x, 4) for x in want[:4].tolist()]})  nonfinite out "
                         f"{int((~torch.isfinite(got)).sum())}/{got.numel()}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file", type=Path)
    p.add_argument("--impl", default=None, help="default: the file's implementation")
    p.add_argument("--vary", action="append", default=[], metavar="NAME=VALUE",
                   help="also run the case with this one change (repeatable)")
    p.add_argument("--rows", type=int, default=3, help="query rows shown per head")
    args = p.parse_args(argv)
    data = json.loads(args.file.read_text())
    impl = registry.get(args.impl or data["impl"])
    case_data = dict(data["case"])
    case_data["config"] = {k: v for k, v in case_data.get("config", {}).items()
                           if not k.startswith("bwd_")}
    case = AttentionCase.from_dict(case_data)
    device = default_device()
    print(f"{impl.name} on {device}: {case}")
    for change in [None] + args.vary:
        print(f"-- {'as recorded' if change is None else change}")
        try:
            variant = case if change is None else _variant(case, change)
            print("\n".join(_rows(impl, variant, device, args.rows)))
        except Exception as exc:      # a bad change, a refusal or a crash: say it, go on
            print(f"  {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
