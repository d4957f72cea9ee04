"""Garbage-collector tuning for a long fuzzing process: the long-lived heap (torch, triton,
hypothesis and their modules, ~184,000 objects) frozen out of full passes, and full passes made
rarer, since a judged case leaves little cyclic garbage behind. Called when judging starts: by a
campaign, and by a pytest session once its test modules are imported.
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
