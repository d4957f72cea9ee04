"""Outcome: one unit of work the command line and the gate report — a regression file replayed on
an implementation, a fuzzing campaign, a mutant self-test — as a verdict word and text.

Every renderer (terminal table, markdown summary, JUnit XML) reads only outcomes, so they agree.
"""
from __future__ import annotations

import dataclasses

# Verdict words, also used as the JUnit status.
OK, FAIL, SKIP, ERROR = "ok", "FAIL", "skip", "error"
DRIFTED, XFAIL, XPASS = "inputs_drifted", "xfail", "XPASS(strict)"
KILLED, SURVIVED = "killed", "SURVIVED"
PASSING = (OK, SKIP, XFAIL, KILLED)


@dataclasses.dataclass
class Outcome:
    stage: str                  # "replay" | "fuzz" | "mutant"
    subject: str                # "abc123.json on sdpa", "sdpa float32", "mutant_phantom_keys"
    verdict: str                # one of the words above
    passed: bool                # counts toward the exit status (skips and expected failures pass)
    cases: int | None = None
    seconds: float | None = None
    detail: str = ""            # one line for tables and the JUnit failure message
    message: str = ""           # the full failure text (heatmap, case, replay command)
    skipped: bool = False
    judged: object = None       # the JudgedCase behind a replay or a campaign's counterexample
    campaign: object = None     # the Campaign behind a fuzz or mutant outcome
    ended: str = ""             # what ended a campaign: "time cap 15 s", "1000 cases" (cli.common.ending)
