"""The distinct defects one campaign found, by root cause, and which defect a failing case
belongs to.

A campaign that keeps going after its first counterexample meets the same bug again through many
cases, and through several checks: a kernel reading V through K's strides crashes on one layout,
reads out of bounds on another and gives wrong values on a third. Each such case must be tallied
to the defect already found, while a second bug must stay a second defect. A defect is known by
its *cause*, the way crash triagers tell bugs apart by where they strike, not by what they print:

    trigger     the one-change predicates its shrunk case needs, found as `fuzzattn explain` finds
                them: each predicate the case satisfies (a causal alignment, a layout off
                contiguous, two tensors laid out differently, a value profile, a custom scale, a
                variant (window, softcap, ALiBi, paging), GQA, unequal lengths, an odd Nk, a last
                page partly filled, a dtype but the simplest declared, each configuration axis off
                its first choice) is undone alone and the case judged again; a predicate whose
                undoing makes the failure go away is needed. Two tensors laid out differently,
                when needed, stands for the per-tensor layouts it implies (layout[v]!=layout[k]
                needs layout[k] off contiguous on one case and layout[v] on another: one cause).
    symptom     the first failing check (with the exception type for a crash) and the keys of
                every check its case failed: what tells causes apart when the trigger is empty
                (the plainest case fails), and what a round's shrink holds to.

Two failures with the same non-empty trigger are one cause, whatever checks fired: a crash and a
wrong value cured by the same change are one bug. A failing case belongs to a known defect when it
has every predicate of the defect's trigger and undoing them cures it (judged: the cure test); a
case that still fails once cured holds another cause too, and is new. A defect with an empty trigger
owns the cases that show its symptom. Predicate values are matched by class (`match_class`): a
configuration axis, window, softcap or ALiBi by being off its plain choice at all (a bug needing
BLOCK_M > BLOCK_N needs it at 32 and 64 alike); the value profiles that put scores past a finite
sentinel as one class; every other predicate by its value, so a bug of each causal alignment stays
its own, unless it fails the other alignment the same way (causal=either).

Known limits: a cause is named by the predicates in this vocabulary, so two bugs needing the same
ones (two causal-mask bugs both needing causal=bottom_right alone) are one row, each case owned
by whichever was found first only when its cure test passes; a bug needing a relation between
two configuration axes may be reported once per axis; workers' rows merge when triggers agree.
"""
from __future__ import annotations

import dataclasses
import functools

from fuzzattn.campaigns import sequences
from fuzzattn.campaigns.sequences import PREDICATE
from fuzzattn.contract.capabilities import Capabilities
from fuzzattn.contract.case import NO_WINDOW, AttentionCase, CaseError
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
    if name in dict(caps.configs) or name in ("window", "softcap", "alibi", "paged_kv"):
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
    origin = f" in {first.origin}" if getattr(first, "origin", "") else ""
    return f"{first.check}: {detail.split(':', 1)[0].strip()}{origin}"


# Tensors a kernel may address alike, the likeliest first: when undoing two of these relations
# makes one case (v laid out apart from q and k, which agree), the first names the cause.
_RELATED = (("k", "v"), ("q", "k"), ("q", "v"))


def different_layouts(a: str, b: str) -> str:
    return f"layout[{a}]≠layout[{b}]"


def factors(case: AttentionCase, caps: Capabilities) -> dict[str, str]:
    """The case's categorical factors that are off their plain choice (module docstring)."""
    return {name: value for name, (value, _) in _off_plain(case, caps).items()}


def _off_plain(case: AttentionCase, caps: Capabilities) -> dict[str, tuple[str, list]]:
    """Each predicate the case satisfies -> (its value, the cases with it undone: one, or for
    unequal lengths two, Nk set to Nq and Nq to Nk, so a bug needing more than one key or query
    is not taken for one needing unequal lengths; for two tensors laid out apart, swapped)."""
    found: dict[str, tuple[str, list]] = {}
    simplest_dtype = next((d for d in DTYPES if d in caps.dtypes), None)
    if case.dtype != simplest_dtype:
        found["dtype"] = (case.dtype, [case.replace(dtype=simplest_dtype)])
    if case.causal != "none":
        found["causal"] = (case.causal, [case.replace(causal="none")])
    if case.values != "normal":
        found["values"] = (case.values, [case.replace(values="normal")])
    if case.windowed:
        found["window"] = (f"{case.window[0]},{case.window[1]}", [case.replace(window=NO_WINDOW)])
    if case.softcap:
        found["softcap"] = (f"{case.softcap:g}", [case.replace(softcap=0.0)])
    for name, off in (("alibi", ""), ("paged_kv", 0)):
        if getattr(case, name) != off:
            found[name] = (str(getattr(case, name)), [case.replace(**{name: off})])
    tensors = dict(zip("qkv", case.layout))

    def laid_out(**changes) -> AttentionCase | None:
        try:
            return case.replace(layout=tuple({**tensors, **changes}[t] for t in "qkv"))
        except CaseError:              # a layout only k and v can take, given to q
            return None

    for tensor, layout in tensors.items():
        if layout != "contiguous":
            found[f"layout[{tensor}]"] = (layout, [laid_out(**{tensor: "contiguous"})])
    for a, b in _RELATED:
        variants = [v for v in (laid_out(**{a: tensors[b]}), laid_out(**{b: tensors[a]}))
                    if v is not None]
        if tensors[a] != tensors[b] and variants:
            found[different_layouts(a, b)] = (PREDICATE, variants)
    if case.scale is not None:
        found["scale"] = ("custom", [case.replace(scale=None)])
    if case.kv_heads != case.heads:
        found["gqa"] = ("yes", [case.replace(kv_heads=case.heads)])
    found.update(sequences.predicates(case))
    first = {name: choices[0] for name, choices in caps.configs}
    config = dict(case.config)
    for name, value in case.config:
        if name in first and value != first[name]:
            plain = tuple(sorted({**config, name: first[name]}.items()))
            found[name] = (str(value), [case.replace(config=plain)])
    return found


def one_change_variants(case: AttentionCase, caps: Capabilities) -> list[tuple[str, str, list]]:
    """(predicate, its value, the cases with it undone) for each predicate the case satisfies:
    what `needed_factors` judges, and `fuzzattn explain` shows, so the two always agree."""
    return [(name, value, variants) for name, (value, variants) in _off_plain(case, caps).items()]


def needed_factors(judged, caps: Capabilities, judge, owned=None) -> dict[str, str]:
    """The trigger of a failing judgement's case: each predicate undone alone, the case judged
    again (`judge(case, gradients=...) -> JudgedCase`); kept when no variant fails with the same
    symptom. A factor whose variants cannot be judged (outside the declaration, refused, pruned)
    cannot be told apart, and is kept; two tensors laid out differently is kept only when some
    variant could be judged, and then stands for the per-tensor layouts it implies.
    `owned(judged) -> bool`: whether a failure belongs to a cause already known; a variant that
    still fails only through one (a case holding two bugs, one of them known) does not count as
    failing the same way, so the new cause's predicates are found in such a case too."""
    key, keys = check_key(judged), failure_keys(judged)
    reproduces = functools.partial(_reproduces, owned=owned)
    needed = {}
    undone = []                        # the variants of the relations found needed so far
    for name, (value, variants) in _off_plain(judged.case, caps).items():
        if value == PREDICATE and name.startswith("layout["):
            variants = [v for v in variants if caps.why_not(v) is None]   # judgeable
            if not variants or all(v in undone for v in variants):
                continue               # nothing to judge, or the same cure as a relation kept
        if not any(reproduces(variant, caps, judge, key, keys) for variant in variants):
            needed[name] = value
            if value == PREDICATE and name.startswith("layout["):
                undone += variants
    for a, b in _RELATED:
        if different_layouts(a, b) in needed:
            needed.pop(f"layout[{a}]", None)
            needed.pop(f"layout[{b}]", None)
    if "causal" in needed:
        # Needing a mask is not needing this alignment: a bug that fails the other one the same
        # way (chunks aligned to the wrong end fail both) is one defect, met through either.
        other = [a for a in caps.causal if a != judged.case.causal]
        if any(reproduces(judged.case.replace(causal=a), caps, judge, key, keys) for a in other):
            needed["causal"] = EITHER_ALIGNMENT
    return needed


def cured(case: AttentionCase, trigger: dict[str, str], caps: Capabilities) -> AttentionCase | None:
    """The case with every predicate of `trigger` undone together (each one's first variant), or
    None when it does not have them all or the result cannot be judged."""
    held = _off_plain(case, caps)
    if any(name not in held for name in trigger):
        return None
    # One undo after another, each on the case the last one left: a packed case's sequence
    # predicates change the same fields (the first sequence alone, then its lengths of 0 made 1),
    # so their changes cannot be merged field by field; one an earlier undo removed is done.
    result = case
    for name in trigger:
        options = _off_plain(result, caps)
        if name in options:
            result = options[name][1][0]
            if result is None:
                return None
    return result if caps.why_not(result) is None else None


def _reproduces(variant: AttentionCase, caps: Capabilities, judge, key: str, keys,
                owned=None) -> bool:
    if caps.why_not(variant) is not None:
        return False
    try:
        again = judge(variant, gradients=key.startswith("grad_"))
    except Exception:                  # a variant the harness cannot judge here
        return False
    return (again.refused is None and again.skipped is None and same_symptom(again, key, keys)
            and not (owned is not None and owned(again)))


def _passes(case: AttentionCase, judge, gradients: bool) -> bool:
    try:
        again = judge(case, gradients=gradients)
    except Exception:                  # a variant the harness cannot judge here
        return False
    return again.refused is None and again.skipped is None and again.passed


@dataclasses.dataclass
class Defect:
    """One distinct defect (a cause): its shrunk counterexample and how many drawn cases hit it."""
    counterexample: object              # campaign.Counterexample (its judged case, its file)
    check_key: str
    keys: frozenset[str]                # of every check its case failed
    factors: dict[str, str]             # its trigger
    hits: int = 1                       # drawn cases that failed this way (shrinking not counted)
    shrunk: bool = True                 # False: reported as drawn (the budget ended first)
    found_at: int | None = None         # cases judged by the campaign when it was found
    # the first failing check of every case tallied to it (the symptoms this cause showed)
    checks: list[str] = dataclasses.field(default_factory=list)
    shrink_note: str = ""               # how far its own shrink got, when cut short
    signature: str = ""                 # its cause as one line (cause_of), set by DefectBook.add

    def __post_init__(self):
        if not self.checks and self.check_key:
            self.checks = [self.check_key]

    @property
    def judged(self):
        return self.counterexample.judged

    def needs(self) -> str:
        return trigger_text(self.factors)

    def showed(self, judged) -> None:
        """Count the symptom of a case tallied to this cause."""
        key = check_key(judged)
        if key and key not in self.checks:
            self.checks.append(key)

    def has_trigger(self, case_factors: dict[str, str], caps: Capabilities) -> bool:
        have = _classes(case_factors, caps)
        return all(have.get(k) == v or (v == EITHER_ALIGNMENT and k == "causal" and k in have)
                   for k, v in _classes(self.factors, caps).items())

    def covers(self, judged, case_factors: dict[str, str], caps: Capabilities) -> bool:
        """Same symptom, and the case has each needed factor in the defect's class of it (the
        symptom test; DefectBook.owner adds the cure test)."""
        return (same_symptom(judged, self.check_key, self.keys)
                and self.has_trigger(case_factors, caps))


def cause_of(trigger: dict[str, str], check: str, caps: Capabilities) -> str:
    """'needs layout[k]≠layout[v]' or, with nothing needed, 'fails plainly: nonfinite'."""
    if not trigger:
        return f"fails plainly: {check}"
    return "needs " + trigger_text(dict(sorted(_classes(trigger, caps).items())))


def trigger_text(trigger: dict[str, str]) -> str:
    """'causal=bottom_right layout[k]≠layout[v]', or 'nothing special' for an empty trigger."""
    return " ".join(k if v == PREDICATE else f"{k}={v}" for k, v in trigger.items()) \
        or "nothing special"


class DefectBook:
    """The defects one campaign found, in the order found. `judge(case, gradients=...)` judges
    the cure tests (module docstring); without it ownership is by symptom and trigger alone."""

    def __init__(self, caps: Capabilities, judge=None):
        self.caps = caps
        self.judge = judge
        self.defects: list[Defect] = []

    def __len__(self) -> int:
        return len(self.defects)

    def owner(self, judged) -> Defect | None:
        """The known defect this failing judgement belongs to, or None (new)."""
        return self.assign(judged)[0]

    def assign(self, judged) -> tuple[Defect | None, bool]:
        """(owner, alone): the known defect this failing judgement belongs to, or None (new): by
        the cure test where a trigger can be undone and judged, else by symptom; a case that
        only all the matching causes together cure is theirs too, tallied to the first, with
        alone False (its symptom is the mixture's, not that cause's)."""
        have = factors(judged.case, self.caps)
        by_symptom = [d for d in self.defects if d.covers(judged, have, self.caps)]
        triggered = [d for d in self.defects if d.factors and d.has_trigger(have, self.caps)]
        gradients = check_key(judged).startswith("grad_")
        if self.judge is not None and triggered:
            for defect in sorted(triggered, key=lambda d: -len(d.factors)):
                cure = cured(judged.case, defect.factors, self.caps)
                if cure is not None and _passes(cure, self.judge, gradients):
                    return defect, True
            together = {}
            for defect in triggered:
                together.update(defect.factors)
            cure = cured(judged.case, together, self.caps)
            if len(triggered) > 1 and cure is not None and _passes(cure, self.judge, gradients):
                return triggered[0], False
        plain = [d for d in by_symptom if not d.factors or self.judge is None
                 or cured(judged.case, d.factors, self.caps) is None]
        return max(plain, key=lambda d: len(d.factors), default=None), True

    def holds(self, defect: Defect, judged) -> bool:
        """Whether a failing judgement fails through `defect`'s cause alone (a cause's shrink)."""
        owner, alone = self.assign(judged)
        return owner is defect and alone

    def fold_mixtures(self) -> list[Defect]:
        """Fold into the causes found later each defect whose case only held them together (a
        case with two bugs, shrunk before either was known, whose trigger is the union of
        theirs): undoing their triggers together cures it. Returns the defects folded away."""
        folded = []
        for defect in list(self.defects):
            have = factors(defect.judged.case, self.caps)
            others = [d for d in self.defects if d is not defect and d not in folded and d.factors
                      and d.has_trigger(have, self.caps)]
            if len(others) < 2 or self.judge is None:
                continue
            together = {}
            for other in others:
                together.update(other.factors)
            cure = cured(defect.judged.case, together, self.caps)
            if cure is not None and _passes(cure, self.judge,
                                            defect.check_key.startswith("grad_")):
                others[0].hits += defect.hits
                folded.append(defect)
        self.defects = [d for d in self.defects if d not in folded]
        return folded

    def add(self, counterexample, judge, *, shrunk: bool = True,
            found_at: int | None = None) -> Defect:
        """Record a counterexample as a defect, its trigger found by judging variants of its
        case with `judge` (`needed_factors`); one whose cause is already recorded (a second
        shrink that ended where an earlier one did, or the same trigger through another check)
        is tallied to it instead."""
        judged = counterexample.judged
        known = lambda failed: self.owner(failed) is not None   # noqa: E731
        key, have = check_key(judged), needed_factors(judged, self.caps, judge, known)
        if not have:
            # Nothing undone alone cures it: a case holding two known causes at once (each
            # undo leaves the other) is theirs when undoing them together cures it.
            owner, _ = self.assign(judged)
            if owner is not None and owner.factors:
                owner.hits += 1
                return owner
        cause = cause_of(have, key, self.caps)
        for known in self.defects:
            if known.signature == cause:
                known.hits += 1
                known.showed(judged)
                return known
        defect = Defect(counterexample, key, failure_keys(judged), have, shrunk=shrunk,
                        found_at=found_at, signature=cause)
        self.defects.append(defect)
        return defect
