"""A campaign's tally of pruned draws: configurations that do not compile for a case class.

The judge reports a case whose configuration fails with an error Triton's autotuner skips as
pruned (fuzzattn/run/pruning.py). A campaign counts those draws per configuration and error,
and per case class (head dim, dtype, causal mode: `pruning.compile_key`), and rejects later
draws of a combination it has already seen pruned without judging them again, so the search
moves on to combinations that compile. The counts are reported after the campaign table:

    BLOCK_M=64 BLOCK_N=64: CompileTimeAssertionFailure for D=32, 41 draws
"""
from __future__ import annotations

import collections

from fuzzattn.contract.case import AttentionCase
from fuzzattn.run.pruning import PRUNED_PREFIX, compile_key, config_text, describe_key


class Pruned:
    def __init__(self):
        self._seen: dict[tuple, str] = {}          # compile key -> error type
        self._draws: collections.Counter = collections.Counter()   # (config, error, class)

    def record(self, case: AttentionCase, refused: str) -> bool:
        """Count a judgement's refusal if it is a pruning (True), else leave it (False)."""
        if not refused.startswith(PRUNED_PREFIX):
            return False
        error = refused[len(PRUNED_PREFIX):].lstrip(": ").split(":", 1)[0]
        key = compile_key(case)
        self._seen[key] = error
        self._draws[(config_text(key[0]), error, describe_key(key))] += 1
        return True

    def seen(self, case: AttentionCase) -> bool:
        """Whether this draw's combination was pruned before (then it is counted again)."""
        if not case.config:
            return False
        key = compile_key(case)
        error = self._seen.get(key)
        if error is None:
            return False
        self._draws[(config_text(key[0]), error, describe_key(key))] += 1
        return True

    def report(self) -> dict[tuple[str, str, str], int]:
        """(configuration, error type, case class) -> pruned draws, most drawn first."""
        return dict(self._draws.most_common())


def pruned_lines(pruned: dict[tuple[str, str, str], int]) -> list[str]:
    """'BLOCK_M=64 BLOCK_N=64: CompileTimeAssertionFailure for D=32, 41 draws' per
    configuration and error, its case classes joined."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for (config, error, case_class), draws in pruned.items():
        grouped.setdefault((config, error), []).append(
            f"{case_class}, {draws} draw{'s' if draws != 1 else ''}")
    return [f"{config}: {error} for {'; '.join(classes)}"
            for (config, error), classes in grouped.items()]
