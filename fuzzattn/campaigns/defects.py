"""The distinct defects one campaign found, and which defect a failing case belongs to.

A campaign that keeps going after its first counterexample meets the same bug again through
many cases; each must be tallied to the defect already found, not shrunk and saved again, while
a second bug must stay a second defect. A defect is known by its *signature*:

    check key   the first failing check, with the exception type for a crash ("crash:
                IndexError", "crash: compile error: CompilationError"), and the keys of every
                check its case failed: two failures are the same symptom when either's first
                key is among the other's (a wrong diagonal that fails out and lse, met again on
                a case where only lse shows, near-constant values, stays one defect)
    factors     the categorical factors of its (shrunk) case that the failure needs, found as
                `fuzzattn explain` finds them: each factor the case has off its plain choice
                (causal alignment, layouts, value profile, a custom scale, GQA, unequal lengths,
                a dtype other than the simplest declared, each configuration axis off its first
                choice) is set to the plain choice alone and the case judged again; a factor
                whose change makes the failure go away (or fail another way) is needed. The
                shrunk case alone cannot say it: the strategy's simplest draw is not plain in
                every factor, so a factor the shrinker could not move is not thereby needed.

A failing case belongs to a defect when it shows the same symptom and has every one of the
defect's factors (the most specific such defect, when several match); otherwise it is new.
So one bug reached through many cases (a kernel wrong for every bottom-right case, whatever the
values or layout) stays one defect, tallied; two bugs with different symptoms, or needing
different factors, stay two. A bug with two symptoms (a wrong diagonal offset that gives wrong
values where Nq < Nk and keys for empty rows where Nq > Nk) is two defects, one per check;
factor values are matched by class (`match_class`): a configuration axis by being off its first
choice at all, since a bug needing BLOCK_M > BLOCK_N needs it at 32 and at 64 alike; the value
profiles that put scores past a finite sentinel as one class, since they reach the same bug at
different magnitudes; every other factor by its value, so a bug of each causal alignment stays
its own. A failure that needs a causal mask is judged once more with the other alignment: when
that fails the same way, the defect needs causal=either (chunks aligned to the wrong end of the
keys fail top-left and bottom-right alike: one defect, met through both). A bug needing a
relation between two configuration axes may still be reported once per axis it was found
needing: over-reported, never hidden.
"""
from __future__ import annotations

import dataclasses

from fuzzattn.contract.capabilities import Capabilities
from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.dtypes import DTYPES

_CRASHES = ("crash", "grad_crash")
# The causal factor of a defect that fails both alignments the same way (`needed_factors`).
EITHER_ALIGNMENT = "either"
# Value profiles that reach one input class (scores past a finite mask sentinel) at different
# magnitudes: a bug found through one is the same bug when met through the other.
_VALUE_CLASSES = {"below_sentinel": "past a finite sentinel",
                  "sentinel_sweep": "past a finite sentinel"}


def match_class(name: str, value: str, caps: Capabilities) -> str:
    """What two defects' factor values must share to be the same factor (module docstring)."""
    if name in dict(caps.configs):
        return "off its first choice"
    if name == "values":
        return _VALUE_CLASSES.get(value, value)
    return value


def _classes(found: dict[str, str], caps: Capabilities) -> dict[str, str]:
    return {name: match_class(name, value, caps) for name, value in found.items()}


def check_key(judged) -> str:
    """The first failing check, with the exception type for a crash."""
    first = judged.first_failure
    return "" if first is None else _key(first)


def failure_keys(judged) -> frozenset[str]:
    """The keys of every check the judgement failed."""
    return frozenset(_key(v) for v in judged.failures)


def same_symptom(judged, key: str, keys: frozenset[str]) -> bool:
    """Whether a failing judgement shows the symptom of one whose first key is `key` and whose
    keys are `keys`: either's first key is among the other's."""
    return check_key(judged) in keys or key in failure_keys(judged)


def _key(first) -> str:
    if first.check not in _CRASHES:
        return first.check
    detail = first.detail
    for prefix in ("second run: ", "refused a declared case: "):
        if detail.startswith(prefix):
            detail = detail[len(prefix):]
    if detail.startswith("compile error: "):
        return f"{first.check}: compile error: {detail[len('compile error: '):].split(':', 1)[0]}"
    return f"{first.check}: {detail.split(':', 1)[0].strip()}"


def factors(case: AttentionCase, caps: Capabilities) -> dict[str, str]:
    """The case's categorical factors that are off their plain choice (module docstring)."""
    return {name: value for name, (value, _) in _off_plain(case, caps).items()}


def _off_plain(case: AttentionCase, caps: Capabilities) -> dict[str, tuple[str, list]]:
    """Each factor off its plain choice -> (its value, the cases with that factor made plain:
    one, or for unequal lengths two, Nk set to Nq and Nq to Nk, so that a bug needing more
    than one key, or more than one query, is not mistaken for one needing unequal lengths)."""
    found: dict[str, tuple[str, list]] = {}
    simplest_dtype = next((d for d in DTYPES if d in caps.dtypes), None)
    if case.dtype != simplest_dtype:
        found["dtype"] = (case.dtype, [case.replace(dtype=simplest_dtype)])
    if case.causal != "none":
        found["causal"] = (case.causal, [case.replace(causal="none")])
    if case.values != "normal":
        found["values"] = (case.values, [case.replace(values="normal")])
    for i, (tensor, layout) in enumerate(zip("qkv", case.layout)):
        if layout != "contiguous":
            plain = tuple("contiguous" if j == i else kind for j, kind in enumerate(case.layout))
            found[f"layout[{tensor}]"] = (layout, [case.replace(layout=plain)])
    if case.scale is not None:
        found["scale"] = ("custom", [case.replace(scale=None)])
    if case.kv_heads != case.heads:
        found["gqa"] = ("yes", [case.replace(kv_heads=case.heads)])
    if case.seq_q != case.seq_k:
        found["lengths"] = ("Nq<Nk" if case.seq_q < case.seq_k else "Nq>Nk",
                            [case.replace(seq_k=case.seq_q), case.replace(seq_q=case.seq_k)])
    first = {name: choices[0] for name, choices in caps.configs}
    config = dict(case.config)
    for name, value in case.config:
        if name in first and value != first[name]:
            plain = tuple(sorted({**config, name: first[name]}.items()))
            found[name] = (str(value), [case.replace(config=plain)])
    return found


def needed_factors(judged, caps: Capabilities, judge) -> dict[str, str]:
    """The factors of a failing judgement's case that its failure needs: each factor made plain
    alone, the case judged again (`judge(case, gradients=...) -> JudgedCase`); kept when the variant does not
    fail with the same check key, or cannot be judged (outside the declaration, refused,
    pruned: then it cannot be told apart, and is kept)."""
    key, keys = check_key(judged), failure_keys(judged)
    needed = {}
    for name, (value, variants) in _off_plain(judged.case, caps).items():
        if not any(_reproduces(variant, caps, judge, key, keys) for variant in variants):
            needed[name] = value
    if "causal" in needed:
        # Needing a mask is not needing this alignment: a bug that fails the other one the same
        # way (chunks aligned to the wrong end fail both) is one defect, met through either.
        other = [a for a in caps.causal if a != judged.case.causal]
        if any(_reproduces(judged.case.replace(causal=a), caps, judge, key, keys) for a in other):
            needed["causal"] = EITHER_ALIGNMENT
    return needed


def _reproduces(variant: AttentionCase, caps: Capabilities, judge, key: str, keys) -> bool:
    if caps.why_not(variant) is not None:
        return False
    try:
        again = judge(variant, gradients=key.startswith("grad_"))
    except Exception:                  # a variant the harness cannot judge here
        return False
    return again.refused is None and again.skipped is None and same_symptom(again, key, keys)


@dataclasses.dataclass
class Defect:
    """One distinct defect: its shrunk counterexample and how many drawn cases hit it."""
    counterexample: object              # campaign.Counterexample (its judged case, its file)
    check_key: str
    keys: frozenset[str]                # of every check its case failed
    factors: dict[str, str]
    hits: int = 1                       # drawn cases that failed this way (shrinking not counted)
    shrunk: bool = True                 # False: reported as drawn (the budget ended first)
    found_at: int | None = None         # cases judged by the campaign when it was found

    @property
    def judged(self):
        return self.counterexample.judged

    def needs(self) -> str:
        """'causal=bottom_right layout[q]=sliced', or 'nothing special' for a case the shrinker
        made simplest everywhere."""
        return " ".join(f"{k}={v}" for k, v in self.factors.items()) or "nothing special"

    def covers(self, judged, case_factors: dict[str, str], caps: Capabilities) -> bool:
        """Same symptom, and the case has each needed factor in the defect's class of it."""
        if not same_symptom(judged, self.check_key, self.keys):
            return False
        have = _classes(case_factors, caps)
        return all(have.get(k) == v or (v == EITHER_ALIGNMENT and k == "causal" and k in have)
                   for k, v in _classes(self.factors, caps).items())


class DefectBook:
    """The defects one campaign found, in the order found."""

    def __init__(self, caps: Capabilities):
        self.caps = caps
        self.defects: list[Defect] = []

    def __len__(self) -> int:
        return len(self.defects)

    def owner(self, judged) -> Defect | None:
        """The most specific known defect this failing judgement belongs to, or None (new)."""
        have = factors(judged.case, self.caps)
        matching = [d for d in self.defects if d.covers(judged, have, self.caps)]
        return max(matching, key=lambda d: len(d.factors), default=None)

    def add(self, counterexample, judge, *, shrunk: bool = True,
            found_at: int | None = None) -> Defect:
        """Record a counterexample as a defect, its factors found by judging variants of its
        case with `judge` (`needed_factors`); one whose signature is already recorded (a second
        shrink that ended where an earlier one did) is tallied to it instead."""
        judged = counterexample.judged
        key, have = check_key(judged), needed_factors(judged, self.caps, judge)
        for known in self.defects:
            if known.check_key == key and (_classes(known.factors, self.caps)
                                           == _classes(have, self.caps)):
                known.hits += 1
                return known
        defect = Defect(counterexample, key, failure_keys(judged), have, shrunk=shrunk,
                        found_at=found_at)
        self.defects.append(defect)
        return defect
