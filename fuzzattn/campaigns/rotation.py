"""Palette rotation: a long campaign moves on to its next compile palette every so many cases.

A compile palette (strategies/palette.py) keeps a campaign's compiled variants few; a campaign
that kept one palette for hours would never see the choices it leaves out. A rotating campaign
numbered n with W shards draws palette n for its first `every` cases, then n + W, n + 2W, ...:
shards of one run (n = seed * W + i) never share a palette, and each palette stays small while
the union over a campaign's palettes covers every declared choice.
"""
from __future__ import annotations

import dataclasses

# Cases a campaign draws from one palette before it moves on: long enough that the palette's
# variants, once compiled, serve many cases (set with benchmarks/compile_variants.py).
EVERY = 1000
# A campaign with a case budget sees at least this many palettes: one palette holds one variant
# combination (plain plus window, or plus softcap, ...), so a 100-case campaign that kept its
# first palette could never draw the variant a bug needs (a window mutant survived a 100-case
# campaign of palette 0, whose combination is softcap). No turn is shorter than MIN_TURN cases.
TURNS = 4
MIN_TURN = 25


def cases_per_turn(max_examples: int | None) -> int:
    """How many cases a campaign of `max_examples` (None: bounded by time only) draws from
    each palette: EVERY, or less so that its budget spans TURNS palettes."""
    if max_examples is None:
        return EVERY
    return max(MIN_TURN, min(EVERY, max_examples // TURNS))


@dataclasses.dataclass(frozen=True)
class PaletteRotation:
    first: int              # the campaign's own palette number (its Hypothesis seed or shard)
    step: int = 1           # the run's shards: palettes first, first + step, ... never meet
    every: int = EVERY      # cases per palette

    def __post_init__(self):
        for name in ("step", "every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")

    def palette(self, turn: int) -> int:
        """The palette of the campaign's `turn`th stretch of `every` cases."""
        return self.first + turn * self.step

    def turn(self, drawn: int) -> int:
        """Which stretch a campaign that has drawn `drawn` cases is in."""
        return drawn // self.every


class RotatingCases:
    """A rotating campaign's cases: one strategy drawing from the palette of the campaign's
    current turn, which the campaign moves on between its rounds (campaign._Rounds), never
    inside one: a round's shrink and final replay draw from the palette its failure came from.

    `cases(palette)` gives one palette's strategy; `ahead`, when given, is told at every turn
    which palette comes next (campaigns/compile_ahead.py: its binaries compiled meanwhile)."""

    def __init__(self, rotation: PaletteRotation, cases, ahead=None):
        self.rotation, self.cases, self.ahead = rotation, cases, ahead
        self.turn = 0
        self.palettes: list[int] = []       # the palettes drawn from, in order
        self._current: tuple[int, object] | None = None

    @property
    def palette(self) -> int:
        return self.rotation.palette(self.turn)

    def begin(self, turn: int, *, last: bool = False, until: float | None = None) -> None:
        """Draw from the palette of `turn` from now on (once its warm-up, if one was asked for,
        has ended, or the campaign's time cap ends at perf_counter() `until`), and have the next
        one compiled ahead unless this is the `last` turn the campaign's case budget reaches."""
        self.turn = turn
        if not self.palettes or self.palettes[-1] != self.palette:
            self.palettes.append(self.palette)
            if self.ahead is not None:
                self.ahead.ready(self.palette, until=until)
                if not last:
                    self.ahead.warm(self.rotation.palette(turn + 1))

    def turn_end(self) -> int:
        """The number of drawn cases at which the current turn ends."""
        return (self.turn + 1) * self.rotation.every

    def strategy(self):
        """The campaign's one strategy: it draws exactly as the current palette's does (the
        flatmap's source draws nothing), so a case replays from its choices within a turn."""
        from hypothesis import strategies as st
        return st.just(None).flatmap(lambda _: self._strategy())

    def _strategy(self):
        if self._current is None or self._current[0] != self.palette:
            self._current = (self.palette, self.cases(self.palette))
        return self._current[1]
