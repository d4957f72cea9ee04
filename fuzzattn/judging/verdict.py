"""Verdicts: the named outcome of one check of one implementation on one case, and where it failed."""
from __future__ import annotations

import dataclasses

import torch

from fuzzattn.contract.case import AttentionCase

# Every check the engine can fail, in the order the engine runs them.
CHECKS = (
    "inputs_drifted",        # a regression file's case no longer materialises the bits it pins
    "flaky",                 # the same case failed in some runs and passed in others
    "crash",                 # the implementation raised on a case it declares
    "device_fault",          # it raised a CUDA error (illegal access, device assert): context poisoned
    "segfault",              # the isolated worker process died (a signal or an exit) mid-case
    "hang",                  # the isolated worker gave no result within the per-case timeout
    "no_configuration_compiles",  # every declared configuration fails to compile for the case
    "contract",              # wrong output shape or dtype, lse missing though declared
    "inputs_mutated",        # q, k or v (or their storage around them) changed by the call
    "out_of_bounds_write",   # a canary around a caller-provided output changed
    "out_of_bounds_read",    # NaN in the output that only appears when padding holds NaN
    "unwritten_output",      # output left holding the NaN poison it was allocated with
    "nonfinite",             # NaN or inf where the oracle is finite, for no other known reason
    "empty_rows",            # rows with no visible key must give out 0 and lse -inf
    "out",                   # output value beyond the tolerance rule
    "lse",                   # logsumexp beyond the tolerance rule
    "out_rms",               # output's rms error over the tensor beyond the error-statistics rule
    "rerun",                 # the run after the references disagrees with the oracle
    "nondeterministic",      # a second run on fresh copies differs bitwise
    # Gradients (fuzzattn/gradients/gradient_verdicts.py), for implementations declaring `backward`; judged only
    # when every forward check passed, so one bug is reported once, at its forward symptom.
    "grad_crash",            # the backward (or autograd) raised, or answered in a wrong shape/dtype
    "grad_inputs_mutated",   # q, k, v, out, lse or dO (or their storage) changed by the backward
    "grad_out_of_bounds_read",  # NaN in a gradient that only appears when padding holds NaN
    "grad_unwritten",        # a gradient left holding the NaN poison it was allocated with
    "grad_nonfinite",        # NaN or inf in a gradient where the oracle's is finite
    "grad_empty_rows",       # rows with no visible key must get dq 0, keys no row sees dk = dv = 0
    "grad_dq",               # dq beyond the gradient tolerance rule
    "grad_dk",               # dk beyond it (GQA: the oracle's dk is summed over each group)
    "grad_dv",               # dv beyond it
    "grad_nondeterministic", # a second backward on the same inputs differs bitwise (if declared)
    "refusal",               # an undeclared input was answered instead of refused
)

# Verdicts only an isolated judge (fuzzattn.isolation.supervisor) can return: the process it judged in
# hung, died or faulted the device. A regression file recording one replays isolated.
PROCESS_CHECKS = ("device_fault", "segfault", "hang")


@dataclasses.dataclass(frozen=True)
class Verdict:
    impl: str
    case: AttentionCase
    check: str
    passed: bool
    error: float | None = None
    allowed: float | None = None
    where: str = ""           # "b0 h1 rows 16-19" ...
    detail: str = ""
    heatmap: str = ""         # a compact per-(batch, head) map of bad query rows
    origin: str = ""          # a crash's innermost frame in the kernel's code (run/execute.py)

    def headline(self) -> str:
        status = "ok" if self.passed else "FAIL"
        numbers = ""
        if self.error is not None and self.allowed is not None:
            numbers = f" error={self.error:.3g} allowed={self.allowed:.3g}"
        where = f" at {self.where}" if self.where else ""
        detail = f": {self.detail}" if self.detail else ""
        origin = f" (raised in {self.origin})" if self.origin else ""
        return f"[{status}] {self.impl} {self.check}{numbers}{where}{detail}{origin}"

    def summary(self) -> str:
        """One line naming the implementation, the check and the case: a failure's first line,
        which is what a test runner's one-line summary of the failure shows."""
        if self.passed:
            return f"{self.impl}: {self.check} ok on {self.case}"
        if self.error is not None and self.allowed is not None:
            return (f"{self.impl}: {self.check} wrong on {self.case} "
                    f"(error {self.error:.3g} > allowed {self.allowed:.3g})")
        detail = self.detail.strip().split("\n", 1)[0] if self.detail else ""
        if len(detail) > 100:
            detail = detail[:97] + "..."
        return f"{self.impl}: {self.check} failed on {self.case}" + (f": {detail}" if detail else "")

    def describe(self) -> str:
        lines = [self.headline(), f"  case: {self.case}", f"  repr: {self.case!r}"]
        if self.heatmap:
            lines.append("  bad query rows (x) per batch/head:")
            lines.extend("    " + line for line in self.heatmap.splitlines())
        return "\n".join(lines)


def _ranges(indices: list[int]) -> str:
    spans, start, prev = [], None, None
    for i in indices:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            spans.append((start, prev))
            start = prev = i
    if start is not None:
        spans.append((start, prev))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def locate(bad_rows: torch.Tensor, max_groups: int = 4) -> str:
    """'b0 h1 rows 16-19; b1 h0 rows 3' for a (B, H, Nq) bool tensor of bad rows."""
    bad_rows = bad_rows.to("cpu")
    groups = []
    for b, h in torch.nonzero(bad_rows.any(dim=-1)).tolist():
        rows = torch.nonzero(bad_rows[b, h]).flatten().tolist()
        groups.append(f"b{b} h{h} rows {_ranges(rows)}")
    if len(groups) > max_groups:
        groups = groups[:max_groups] + [f"... {len(groups) - max_groups} more (batch, head) pairs"]
    return "; ".join(groups)


def heatmap(bad_rows: torch.Tensor, width: int = 64, max_lines: int = 8) -> str:
    """One line per (batch, head): 'x' where a query row (or a bucket of rows) is wrong."""
    bad_rows = bad_rows.to("cpu")
    B, H, N = bad_rows.shape
    if N == 0:
        return ""
    per_cell = max(1, -(-N // width))
    lines = []
    for b in range(B):
        for h in range(H):
            row = bad_rows[b, h]
            cells = "".join("x" if row[i:i + per_cell].any() else "."
                            for i in range(0, N, per_cell))
            lines.append(f"b{b} h{h} |{cells}|")
    if per_cell > 1:
        lines.append(f"(each cell is {per_cell} query rows)")
    if len(lines) > max_lines:
        hidden = len(lines) - max_lines
        lines = lines[:max_lines] + [f"... {hidden} more lines"]
    return "\n".join(lines)
