"""A campaign's tally of pruned draws: configurations that do not compile for a case class.

The judge reports a case whose configuration fails with an error Triton's autotuner skips as
pruned (fuzzattn/run/pruning.py). A campaign counts those draws per configuration and error,
and per case class (head dim, dtype, causal mode: `pruning.compile_key`), and rejects later
draws of a combination it has already seen pruned without judging them again, so the search
moves on to combinations that compile. The counts are reported after the campaign table, one
line per error and case class:

    CompileTimeAssertionFailure for D=32 float16: 6 configurations (BLOCK_M=16|32|64 BLOCK_N=64
    num_warps=4|8), 41 draws
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
    """One line per error and case class, most drawn first: the configurations it pruned, each
    axis with the values they take ('BLOCK_M=16|32 BLOCK_N=64'), and the draws they cost. An
    autotuned kernel's space prunes dozens of configurations for one reason (every tile wider
    than D), which one line per configuration buried."""
    groups: dict[tuple[str, str], dict[str, int]] = {}
    for (config, error, case_class), draws in pruned.items():
        configs = groups.setdefault((error, case_class), {})
        configs[config] = configs.get(config, 0) + draws
    lines = []
    for (error, case_class), configs in sorted(groups.items(), key=lambda g: -sum(g[1].values())):
        draws = sum(configs.values())
        counted = f"{draws} draw{'s' if draws != 1 else ''}"
        if len(configs) == 1:
            lines.append(f"{error} for {case_class}: {next(iter(configs))}, {counted}")
            continue
        axes: dict[str, list[str]] = {}
        for config in configs:
            for item in config.split():
                name, value = item.split("=", 1)
                if value not in axes.setdefault(name, []):
                    axes[name].append(value)
        values = " ".join(f"{name}={'|'.join(sorted(v, key=_numeric_first))}"
                          for name, v in axes.items())
        lines.append(f"{error} for {case_class}: {len(configs)} configurations ({values}), "
                     f"{counted}")
    return lines


def _numeric_first(value: str) -> tuple:
    return (not value.isdigit(), int(value) if value.isdigit() else 0, value)
