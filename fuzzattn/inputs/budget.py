"""The memory budget of one judged case, checked before anything is allocated: a case too large
is a usage error naming its sizes, never a kernel crash."""
from __future__ import annotations

import os

from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.dtypes import BY_NAME

# The most memory one judged case may take, checked before anything is allocated: inputs in
# their padded storage (sliced layouts double the rows), outputs, and the float64 oracle's
# (B, H, Nq, Nk) score matrices (about three alive at once). 8 GiB fits a CPU CI machine
# and leaves a GPU plenty (docs/CALIBRATION.md#memory-budget); FUZZATTN_MEMORY_BUDGET_GB overrides.
DEFAULT_BUDGET_GB = 8.0


class CaseTooLargeError(ValueError):
    """A case whose tensors would not fit the memory budget: a usage error, not a kernel crash."""


def case_bytes(case: AttentionCase) -> int:
    """An upper estimate of the bytes judging `case` allocates at once."""
    item = BY_NAME[case.dtype].itemsize
    d = case.head_dim + 3
    tensors = (case.batch * case.heads * (2 * case.seq_q + 1) * d
               + 2 * case.batch * case.kv_heads * (2 * case.seq_k + 1) * d) * item
    oracle_scores = 3 * case.batch * case.heads * case.seq_q * case.seq_k * 8
    return 3 * tensors + oracle_scores


def check_budget(case: AttentionCase) -> None:
    """Raise CaseTooLargeError (one line, naming the sizes) before allocating a case too large."""
    budget = float(os.environ.get("FUZZATTN_MEMORY_BUDGET_GB") or DEFAULT_BUDGET_GB) * 2**30
    need = case_bytes(case)
    if need > budget:
        raise CaseTooLargeError(
            f"case B={case.batch} H={case.heads} Nq={case.seq_q} Nk={case.seq_k} D={case.head_dim} "
            f"needs about {need / 2**30:.3g} GiB, over the {budget / 2**30:.3g} GiB budget "
            "(FUZZATTN_MEMORY_BUDGET_GB)")
