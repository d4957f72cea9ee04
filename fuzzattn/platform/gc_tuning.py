"""The process's long-lived heap, frozen out of the garbage collector's full passes, and those
passes made rarer.

A fuzzing process holds ~184,000 objects for its whole life (torch, triton, hypothesis and their
modules, on a CPU-only machine), and every full (generation 2) collection walks all of them again:
measured on the 2-core machine, 110-185 ms each, about one per 200 judged sdpa cases, i.e. up to
0.9 ms of a 4 ms case, landing on whichever case (or whichever leg of a benchmark) triggered it.
After `gc.freeze()` a full collection walks only what was created since (~30 ms, measured the same
way). Called when judging starts: a campaign (campaigns/campaign.py) and a pytest session once
its test modules are imported (pytest_plugin.py).

What is created since keeps growing for the whole campaign (Hypothesis's tree of the choices it
made, the verdict memo), and a full pass walks it all: measured over 2,000 judged sdpa fp32 ci
cases after the freeze (benchmarks/gc_passes.py), 5 full passes of 40-52 ms each, 0.10-0.13 ms
of a ~2.9 ms case, where every younger pass together cost 0.06 ms. A judged case leaves little
cyclic garbage behind (~3,700 more objects tracked after those 2,000 cases without any full
pass, 2.5%; a crashing kernel's traceback, which held its frames' tensors in a cycle, is dropped:
execute._detached), so FULL_PASS_AFTER raises Python's default of a full pass per 10
generation-1 passes to one per 100: no full pass in those 2,000 cases, GC time 0.16-0.20 -> 0.06
ms a case.
"""
from __future__ import annotations

import gc

FULL_PASS_AFTER = 100      # generation-1 passes per full pass (Python's default: 10)

_frozen = False


def freeze_long_lived() -> None:
    """Move every object alive now out of the collector's reach, once per process, garbage
    collected first so that nothing collectable is frozen, and make full passes over what is
    created later rarer (FULL_PASS_AFTER). What is created later is collected as before."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
    young, middle, full = gc.get_threshold()
    gc.set_threshold(young, middle, max(full, FULL_PASS_AFTER))
