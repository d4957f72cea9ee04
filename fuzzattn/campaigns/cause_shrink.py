"""A cause's own shrink: the smallest case found that still fails through the same cause.

Hypothesis shrinks a round's first failure holding to its symptom (campaign.py). Its shrink can
be cut short (by the time cap, or by the share of it one shrink may take so that a cause hit
thousands of times does not starve the search for rarer ones), and a failure met while another
shrank is reported as drawn. This shrink finishes those, on the case itself: it tries one
simplification at a time, the largest first (one batch element and head, the shortest lengths,
the smallest declared head dim, then each layout, value profile, scale, mask and configuration
choice set plain, then data seed 0; never the dtype, which a campaign holds fixed), and keeps each candidate that still fails
*through the same cause*: DefectBook.assign names this defect as its owner, so a candidate
that loses the trigger, or fails for another reason too, is not taken. Greedy, restarting after
each success, and bounded by judged cases and seconds: it ends at a case no single step
simplifies, or says how far it got.
"""
from __future__ import annotations

import dataclasses
import time

from fuzzattn.campaigns import sequences
from fuzzattn.contract.capabilities import Capabilities
from fuzzattn.contract.case import AttentionCase, CaseError

# Judged candidates one cause's shrink may spend: a few passes over ~20 steps from a drawn case
# of hundreds of rows (each success restarts the pass); a shrink that needs more is reported
# cut short rather than holding a campaign past its cap.
MAX_JUDGED = 200


@dataclasses.dataclass
class Shrunk:
    """What one cause's shrink did: the smallest failing case found (judged), how many
    candidates it judged, and whether it ended before no step simplified further."""
    judged: object
    steps: int                  # candidates taken
    tried: int                  # candidates judged
    seconds: float
    complete: bool

    def note(self, drawn: AttentionCase) -> str:
        """'' when complete; else how far it got."""
        if self.complete:
            return ""
        return (f"shrink cut short after {self.tried} judged cases ({self.seconds:.1f} s, "
                f"{self.steps} steps from {_size(drawn)})")


def _size(case: AttentionCase) -> str:
    return f"B={case.batch} H={case.heads} Nq={case.seq_q} Nk={case.seq_k} D={case.head_dim}"


def _shorter(n: int, floor: int, multiple: int) -> list[int]:
    """Candidate lengths below n, smallest first: the floor, halves, one step less."""
    out = []
    for m in (floor, n // 2, n - multiple):
        m -= m % multiple
        if floor <= m < n and m not in out:
            out.append(m)
    return out


def candidates(case: AttentionCase, caps: Capabilities) -> list[AttentionCase]:
    """Every one-step simplification of `case` the implementation declares, largest first."""
    c = case
    steps: list[dict] = sequences.shrink_steps(c)     # fewer sequences first: [] when dense
    if c.batch > 1:
        steps += [dict(batch=1), dict(batch=c.batch // 2)]
    if c.kv_heads > 1:
        group = c.heads // c.kv_heads
        steps += [dict(heads=group, kv_heads=1),                         # one group left
                  dict(heads=group * (c.kv_heads // 2), kv_heads=c.kv_heads // 2)]
    if c.heads > c.kv_heads:
        steps.append(dict(heads=c.kv_heads))                             # no grouping at all
    floor = max(caps.min_seq_len, 0 if caps.zero_length else 1)
    for m in _shorter(max(c.seq_q, c.seq_k), floor, caps.seq_multiple):
        steps.append(dict(seq_q=min(c.seq_q, m), seq_k=min(c.seq_k, m)))   # both at most m
    for name in ("seq_q", "seq_k"):
        for m in _shorter(getattr(c, name), floor, caps.seq_multiple):
            steps.append({name: m})
    if c.seq_q != c.seq_k:                       # keep the gap, shorten both
        gap = abs(c.seq_q - c.seq_k)
        short = min(c.seq_q, c.seq_k)
        for m in _shorter(short, floor, caps.seq_multiple):
            steps.append(dict(seq_q=m + (gap if c.seq_q > c.seq_k else 0),
                              seq_k=m + (gap if c.seq_k > c.seq_q else 0)))
    dims = sorted(caps.head_dims) if caps.head_dims is not None else [1, 2, 4, 8, 16, 32, 64]
    steps += [dict(head_dim=d) for d in dims if d < c.head_dim]
    for i in range(3):
        if c.layout[i] != "contiguous":
            steps.append(dict(layout=c.layout[:i] + ("contiguous",) + c.layout[i + 1:]))
    if c.values != "normal":
        steps.append(dict(values="normal"))
    if c.scale is not None:
        steps.append(dict(scale=None))
    if c.causal != "none":
        steps.append(dict(causal="none"))
    if c.windowed:      # the window off, else one side unbounded
        steps += [dict(window=w) for w in ((-1, -1), (-1, c.window[1]), (c.window[0], -1))
                  if w != c.window]
    if c.softcap:
        steps.append(dict(softcap=0.0))
    if c.alibi:
        steps.append(dict(alibi=""))
    if c.paged_kv:
        steps.append(dict(paged_kv=0))
    first = {name: choices[0] for name, choices in caps.configs}
    for name, value in c.config:
        if name in first and value != first[name]:
            steps.append(dict(config=tuple(sorted({**dict(c.config), name: first[name]}.items()))))
    if c.data_seed:
        steps.append(dict(data_seed=0))
    out, seen = [], {c}
    for change in steps:
        if not change:
            continue
        try:
            candidate = c.replace(**change)
        except CaseError:
            continue
        if candidate not in seen and caps.why_not(candidate) is None:
            seen.add(candidate)
            out.append(candidate)
    return out


def shrink_cause(judged, holds, judge, caps: Capabilities, *, seconds: float | None,
                 max_judged: int = MAX_JUDGED) -> Shrunk:
    """Shrink a failing judgement's case while `holds(judged) -> bool` (it fails through the
    same cause); `judge(case) -> JudgedCase`. Ends at a case no step simplifies (complete), or
    when `max_judged` candidates or `seconds` (None: no time limit) are spent."""
    start = time.perf_counter()
    tried = steps = 0
    best = judged

    def spent() -> bool:
        return tried >= max_judged or (seconds is not None
                                       and time.perf_counter() - start > seconds)

    improved = True
    while improved:
        improved = False
        for candidate in candidates(best.case, caps):
            if spent():
                return Shrunk(best, steps, tried, time.perf_counter() - start, complete=False)
            tried += 1
            try:
                again = judge(candidate)
            except Exception:           # a candidate the harness cannot judge here: skipped
                continue
            if (again.refused is None and again.skipped is None and again.failures
                    and holds(again)):
                best, steps, improved = again, steps + 1, True
                break
    return Shrunk(best, steps, tried, time.perf_counter() - start, complete=True)
