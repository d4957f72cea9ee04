"""One Outcome for a campaign that --workers spread over several processes (fuzzattn/cli/workers.py):
the workers' cases, refusals and budgets summed, and each distinct failure listed once.

With defect causes (campaigns/defects.py: the trigger its shrunk case needs, or with none its
symptom), defects found by several workers are one, their hits summed, and the
regression files their later shrinks wrote in this run removed: one file per defect. Without
them, two failures are one when they are the same shrunk case (the same regression file).

A worker that met a case holding two bugs before it knew either shrinks it to a mixture: a row
needing the union of two other rows' triggers (`values=below_sentinel lengths=Nq>Nk` beside
`values=below_sentinel` and `lengths=Nq>Nk`), or needing nothing when no single undo cures it.
Its own process folds such a row into the causes once it finds them (DefectBook.fold_mixtures,
by the cure test); across workers, where the causes were found elsewhere, a row is folded by
its triggers alone: when two or more other rows' triggers are all in its case and, for a row
with a trigger, together make it up exactly. A row needing nothing whose case holds exactly one
other row's trigger and first fails a check that row showed is that cause, met where its cure
test did not hold (a kernel whose output changes between calls: an autotuner's, a race); a plain
bug's shrunk case keeps no predicate it does not need. Its file goes with it.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import os

from fuzzattn.campaigns.outcome import ERROR, FAIL, OK, SKIP, Outcome
from fuzzattn.cli import common


def _signature(defect) -> str:
    """Two workers' defects are one when their causes are (campaigns/defects.py)."""
    return defect.signature


def _found_key(found) -> tuple:
    """Without defect signatures: one failure when it is the same shrunk case (the same file)."""
    if found.written is not None:
        return ("file", str(found.written.path))
    return ("case", found.judged.case.key())


def _rerun(outcome) -> str:
    """The command that reruns the worker that found it (common._failure_text's last line)."""
    marker = "  found by: "
    return next((line[len(marker):] for line in outcome.message.splitlines()
                 if line.startswith(marker)), "")


def _distinct(failed: list) -> list[tuple]:
    """(counterexample, defect or None, rerun) of each distinct failure, in the order found;
    defects met by several workers are tallied together, and the regression files of their
    later shrinks, when this run wrote them, are removed (one file per defect)."""
    merged: dict[tuple, list] = {}
    for outcome in failed:
        campaign, rerun = outcome.campaign, _rerun(outcome)
        defects = getattr(campaign, "defects", None) or []
        if not defects:
            merged.setdefault(_found_key(campaign.counterexample),
                              [campaign.counterexample, None, rerun])
            continue
        for defect in defects:
            kept = merged.get(_signature(defect))
            if kept is None:
                merged[_signature(defect)] = [defect.counterexample, dataclasses.replace(defect), rerun]
                continue
            kept[1].hits += defect.hits
            kept[1].checks += [c for c in defect.checks if c not in kept[1].checks]
            extra = defect.counterexample.written
            if extra is not None and extra.new and extra.path != getattr(kept[0].written, "path", None):
                with contextlib.suppress(OSError):
                    os.unlink(extra.path)
    return [tuple(entry) for entry in merged.values()]


def _fold_mixtures(distinct: list[tuple], caps) -> list[tuple]:
    """`distinct` without the rows that are mixtures of two or more others (module docstring)."""
    from fuzzattn.campaigns.defects import factors, match_class
    folded: list[int] = []
    for i, (found, defect, _) in enumerate(distinct):
        if defect is None or caps is None:
            continue
        mine = {(k, match_class(k, v, caps)) for k, v in defect.factors.items()}
        have = factors(found.judged.case, caps)
        parts = [other for j, (_, other, _) in enumerate(distinct)
                 if j != i and j not in folded and other is not None and other.factors
                 and other.has_trigger(have, caps)]
        pieces = [{(k, match_class(k, v, caps)) for k, v in p.factors.items()} for p in parts]
        if mine:
            kept = [(p, piece) for p, piece in zip(parts, pieces) if piece < mine]
            parts = [p for p, _ in kept]
            if set().union(*(piece for _, piece in kept)) != mine:
                continue
        if len(parts) < 2 and not (not mine and len(parts) == 1
                                   and defect.check_key in parts[0].checks):
            continue
        folded.append(i)
        parts[0].hits += defect.hits
    kept_paths = {getattr(distinct[i][0].written, "path", None)
                  for i in range(len(distinct)) if i not in folded}
    for i in folded:
        written = distinct[i][0].written
        if written is not None and written.new and written.path not in kept_paths:
            with contextlib.suppress(OSError):
                os.unlink(written.path)
    return [entry for i, entry in enumerate(distinct) if i not in folded]


def merge(stage: str, label: str, parts: list, problems: list[str], wall: float, *,
          max_examples: int | None, seconds: float | None, caps=None) -> Outcome:
    """One Outcome (with a Campaign) for the workers' Outcomes of one campaign."""
    campaigns = [o.campaign for o in parts if o.campaign is not None]
    cases = sum(o.cases or 0 for o in parts)
    refused, forward_only = collections.Counter(), collections.Counter()
    for c in campaigns:
        refused.update(c.refused)
        forward_only.update(c.forward_only)
    distinct = _fold_mixtures(_distinct([o for o in parts if o.campaign is not None
                                         and o.campaign.counterexample is not None]), caps)
    firsts = [c.cases_to_first_failure for c in campaigns if c.cases_to_first_failure is not None]
    errors = [o.detail for o in parts if o.verdict == ERROR] + problems
    campaign = None
    if campaigns:
        campaign = dataclasses.replace(
            campaigns[0], cases=cases, seconds=wall,
            counterexample=distinct[0][0] if distinct else None,
            cases_to_first_failure=min(firsts) if firsts else None,
            error=errors[0] if errors and not distinct else None,
            budget_hit=any(c.budget_hit for c in campaigns), ended=_ended(campaigns),
            refused=dict(refused),
            forward_only=dict(forward_only))
        if hasattr(campaign, "defects"):
            campaign.defects = [d for _, d, _ in distinct if d is not None]
    if distinct:
        found = distinct[0][0]
        detail = f"{found.judged.first_failure.check}: {found.judged.case}"
        if len(distinct) > 1:
            detail = f"{len(distinct)} defects: " + ", ".join(
                f"{d.check_key} ({d.hits} case{'s' if d.hits != 1 else ''})" if d is not None
                else c.judged.first_failure.check for c, d, _ in distinct)
        message = "\n\n".join(common._failure_text(c, rerun, *([d] if d is not None else []))
                               for c, d, rerun in distinct)
        outcome = Outcome(stage, label, FAIL, False, cases, wall, detail=detail,
                          message=message + "".join("\n" + p for p in problems), judged=found.judged)
    elif errors:
        messages = [o.message for o in parts if o.verdict == ERROR] + problems
        outcome = Outcome(stage, label, ERROR, False, cases, wall, detail=common.flattened(errors[0]),
                          message="\n".join(messages))
    elif parts and all(o.skipped for o in parts):
        outcome = Outcome(stage, label, SKIP, True, cases, wall, detail=parts[0].detail, skipped=True)
    elif cases == 0 and campaign is not None and campaign.budget_hit:
        outcome = Outcome(stage, label, SKIP, True, 0, wall, skipped=True,
                          detail=common.unfuzzed(seconds))
    else:
        outcome = Outcome(stage, label, OK, True, cases, wall)
        if campaign is not None and campaign.budget_hit:
            outcome.detail = f"{common.cap_reached(seconds, cases, max_examples)} ({len(parts)} workers)"
    if campaign is not None and campaign.refusal_note() and not outcome.skipped:
        loud = "MOSTLY REFUSED: " if campaign.mostly_refused else ""
        outcome.detail = "; ".join(filter(None, [outcome.detail, loud + campaign.refusal_note()]))
    outcome.campaign = campaign
    if campaign is not None:
        outcome.ended = common.ending(campaign.ended, seconds, max_examples)
    return outcome


def _ended(campaigns: list) -> str:
    """What ended a campaign spread over workers: the time cap if it ended any of them, else
    what ended most of it."""
    endings = {"time" if c.budget_hit else c.ended for c in campaigns}
    return next((e for e in ("time", "first failure", "cases", "exhausted") if e in endings), "")
