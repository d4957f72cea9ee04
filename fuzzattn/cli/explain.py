"""`fuzzattn explain FILE --impl NAME`: triage of one failure, one factor at a time.

The file's case is judged as recorded, then again with exactly one factor changed toward the simple
side: each other SDPA backend (for an sdpa* implementation), each other choice of every declared
configuration axis (the mask form among them), values -> normal, layout -> contiguous, scale -> the
default 1/sqrt(D), causal, window, softcap, ALiBi and paging off, each other declared dtype, and the
whole configuration at each axis's first choice; then every other one-change variant by which a
campaign finds what a defect needs (campaigns/defects.py: lengths made equal either way, Nk made
even, GQA undone, one tensor's layout or two tensors' relation undone). Each variant is a new case
with the same data seed, so only the changed factor differs (for values, layout and dtype the
tensors change with it, which is the point). One table, then one line reading it, then the `needs:`
a campaign's table would give the case, found from the same judgements.

A file whose failure ends or corrupts the process judging it (a hang, segfault or device fault,
or a case the implementation's unsafe known defect covers: campaigns.file_replay.needs_isolation) has
each variant judged in a worker process of its own, so one variant's fault cannot pass for the
next one's failure; it costs a worker's start-up per variant. So does `--isolate`, and so does a
watched explain that a variant crashed (cli/watched.py runs it again with `--isolate`).

A variant the implementation does not declare is shown as such and not run; a variant it refuses
with a declared error (an SDPA backend's "No available kernel") is shown as refused. Neither
counts as passing. While it runs, a line per variant on stderr ('explain 3/9  causal=none  pass
2.1 s'). Exit status 0 once the table is printed (it is a diagnosis, not a check);
2 for a file or implementation that cannot be used, as one line.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from fuzzattn.cli import common, tables

PASS, FAIL, REFUSED, UNDECLARED, SKIPPED = "pass", "FAIL", "refused", "not declared", "skipped"


def add_parser(commands) -> None:
    p = commands.add_parser("explain", help="triage one failure: rerun its case one factor at a time",
                            description="Rerun a regression file's case on one implementation with "
                                        "one factor changed at a time (backend, configuration, "
                                        "values, layout, scale, causal, dtype) and say which "
                                        "changes make the failure go away.")
    p.add_argument("path", type=Path, metavar="FILE", help="a regression file")
    p.add_argument("--impl", required=True, metavar=common.IMPL_METAVAR,
                   help="the implementation to explain the failure of")
    p.add_argument("--isolate", action="store_true",
                   help="judge each variant in a worker process of its own (automatic for a file "
                        "that records a hang, segfault or device fault, and after a crash)")
    p.set_defaults(run=run)


@dataclasses.dataclass
class Variant:
    factor: str                 # what was changed ("as recorded" for the baseline)
    changed_to: str             # its new value, as a reader would write it
    impl: object                # the implementation run (another backend for "backend")
    case: object
    verdict: str = ""
    check: str = ""
    numbers: str = ""
    judged: object = None       # its JudgedCase, once judged in this process


def _config_for(impl, case) -> tuple:
    """The case's configuration carried over to `impl`: none when the case names none (it then
    runs each implementation's default); else the axes `impl` declares keep the case's value
    where that is one of its choices, or take the first choice; axes it lacks are dropped."""
    given = case.config_dict
    if not given:
        return ()
    return tuple(sorted((name, given[name] if given.get(name) in choices else choices[0])
                        for name, choices in impl.caps.configs))


def _sdpa_backends(impl) -> list[tuple[str, object, str]]:
    """(name, implementation or None, why not here) of the other SDPA implementations."""
    if not (impl.name == "sdpa" or impl.name.startswith("sdpa_")):
        return []
    registered = {i.name: i for i in common.registered()
                  if i.name == "sdpa" or i.name.startswith("sdpa_")}
    try:        # this repository's kernels say why a backend is absent on this machine
        from fuzzattn.kernels.sdpa import UNAVAILABLE
    except ImportError:
        UNAVAILABLE = {}
    names = sorted(set(registered) | set(UNAVAILABLE), key=lambda n: (n != "sdpa", n))
    return [(n, registered.get(n), UNAVAILABLE.get(n, "not registered here"))
            for n in names if n != impl.name]


def variants(impl, case) -> list[Variant]:
    """The baseline, then one variant per factor that can change (in the order of the table)."""
    from fuzzattn.contract.dtypes import DTYPES
    rows = [Variant("as recorded", "-", impl, case)]
    for name, other, why in _sdpa_backends(impl):
        if other is None:
            rows.append(Variant("backend", name, None, case, verdict=UNDECLARED,
                                check=f"absent here: {why}"))
            continue
        moved = case.replace(config=_config_for(other, case))
        note = "" if moved.config == case.config else \
            " (" + (",".join(f"{k}={v}" for k, v in moved.config) or "no config") + ")"
        rows.append(Variant("backend", name + note, other, moved))
    first = {}
    for axis, choices in impl.caps.configs:
        first[axis] = choices[0]
        current = case.config_dict.get(axis)
        for choice in choices:
            if choice != current:
                config = dict(case.config_dict, **{axis: choice})
                rows.append(Variant(axis, f"{axis}={choice}", impl,
                                    case.replace(config=tuple(sorted(config.items())))))
    simplest = tuple(sorted(first.items()))
    differing = [a for a, v in first.items() if case.config_dict.get(a) != v]
    if len(differing) > 1:      # one axis at its first choice is already a row above
        rows.append(Variant("config", "each axis's first choice", impl, case.replace(config=simplest)))
    if case.values != "normal":
        rows.append(Variant("values", "values=normal", impl, case.replace(values="normal")))
    if set(case.layout) != {"contiguous"}:
        rows.append(Variant("layout", "layout=contiguous", impl,
                            case.replace(layout=("contiguous",) * 3)))
    if case.scale is not None:
        rows.append(Variant("scale", "scale=default", impl, case.replace(scale=None)))
    if case.causal != "none":
        rows.append(Variant("causal", "causal=none", impl, case.replace(causal="none")))
    if case.windowed:
        rows.append(Variant("window", "window=-1,-1", impl, case.replace(window=(-1, -1))))
    if case.softcap:
        rows.append(Variant("softcap", "softcap=0", impl, case.replace(softcap=0.0)))
    if case.alibi:
        rows.append(Variant("alibi", "alibi=off", impl, case.replace(alibi="")))
    if case.paged_kv:
        rows.append(Variant("paged_kv", "paged_kv=0", impl, case.replace(paged_kv=0)))
    for dtype in DTYPES:
        if dtype != case.dtype and dtype in impl.caps.dtypes:
            rows.append(Variant("dtype", f"dtype={dtype}", impl, case.replace(dtype=dtype)))
    return rows + _predicate_rows(impl, case, {r.case for r in rows})


def _predicate_rows(impl, case, shown) -> list[Variant]:
    """A row for each one-change variant a campaign's `needs` is found by (campaigns/defects.py:
    the lengths made equal either way, Nk made even, GQA undone, one tensor's layout or two
    tensors' relation undone) that no row above already judges."""
    from fuzzattn.campaigns.defects import PREDICATE, one_change_variants
    rows = []
    for name, value, cases in one_change_variants(case, impl.caps):
        for variant in cases:
            if variant is None or variant in shown:
                continue
            shown.add(variant)
            what = name if value == PREDICATE else f"{name}={value}"
            rows.append(Variant(what, _difference(case, variant), impl, variant))
    return rows


def _difference(case, variant) -> str:
    """'Nq=3 Nk=3' or 'layout[v]=contiguous': what the variant changed."""
    parts = []
    packed = (variant.seqlens_q, variant.seqlens_k) != (case.seqlens_q, case.seqlens_k)
    if packed:        # a packed case's totals follow its sequences: name those
        parts.append("seqlens=" + ",".join(f"{a}/{b}" for a, b in zip(variant.seqlens_q,
                                                                      variant.seqlens_k)))
    for field, label in (("seq_q", "Nq"), ("seq_k", "Nk"), ("kv_heads", "Hkv")):
        if getattr(variant, field) != getattr(case, field) and not (packed and field != "kv_heads"):
            parts.append(f"{label}={getattr(variant, field)}")
    for tensor, (was, now) in zip("qkv", zip(case.layout, variant.layout)):
        if was != now:
            parts.append(f"layout[{tensor}]={now}")
    return " ".join(parts) or "-"


def _worst(judged):
    """The numeric verdict closest to (or furthest past) its bound: the failure's, or on a pass
    the tightest one, so a pass shows how much margin it had."""
    numeric = [v for v in judged.verdicts if v.error is not None and v.allowed is not None]
    if judged.first_failure is not None:
        return judged.first_failure
    return max(numeric, key=lambda v: v.error / v.allowed if v.allowed else float("inf"),
               default=None)


def judge_variant(row: Variant, isolated: bool = False) -> Variant:
    from fuzzattn.judgement.judge import judge
    if row.verdict:             # decided without running (a backend absent here)
        return row
    why = row.impl.caps.why_not(row.case)
    if why is not None:
        row.verdict, row.check = UNDECLARED, why
        return row
    if isolated:                # a fresh worker: the last variant's fault is not this one's
        from fuzzattn.isolation.pool import DEFAULT_TIMEOUT
        from fuzzattn.isolation.supervisor import IsolatedJudge
        with IsolatedJudge(row.impl, timeout=DEFAULT_TIMEOUT) as worker:
            judged = worker.judge(row.case, margins=True)
    else:
        judged = judge(row.impl, row.case, margins=True)   # numbers against the whole rule
        row.judged = judged
    if judged.skipped:
        row.verdict, row.check = SKIPPED, judged.skipped
    elif judged.refused:
        row.verdict, row.check = REFUSED, judged.refused
    else:
        row.verdict = PASS if judged.passed else FAIL
        worst = _worst(judged)
        if worst is not None:
            row.check = worst.check if not judged.passed else f"({worst.check})"
            if worst.error is not None and worst.allowed is not None:
                row.numbers = f"{worst.error:.3g} / {worst.allowed:.3g}"
    return row


def reading(rows: list[Variant]) -> str:
    """One line: what the baseline did, which changes make it pass, which still fail."""
    base, rest = rows[0], rows[1:]
    passes = [r.changed_to for r in rest if r.verdict == PASS]
    fails = [r.changed_to for r in rest if r.verdict == FAIL]
    if base.verdict == PASS:
        head = "the recorded case passes here: nothing to explain"
        return head + (f"; fails when: {', '.join(fails)}" if fails else "")
    if base.verdict != FAIL:
        return f"the recorded case was not judged ({base.verdict}: {base.check})"
    parts = [f"passes when: {', '.join(passes) if passes else 'no single change'}"]
    if fails:
        parts.append(f"still fails when: {', '.join(fails)}")
    return "; ".join(parts)


def run(args) -> int:
    from fuzzattn.campaigns.regression_file import RegressionFileError, load
    if args.path.is_dir():
        raise common.CLIError(f"{args.path}: a directory; explain takes one regression file")
    if not args.path.is_file():
        raise common.CLIError(f"{args.path}: no such regression file")
    try:
        record = load(args.path)
    except RegressionFileError as exc:
        raise common.CLIError(str(exc)) from None
    impl = common.resolve(args.impl)
    why = impl.caps.why_not(record.case)
    if why is not None:
        raise common.CLIError(f"--impl {args.impl}: {impl.name} does not declare the file's case "
                              f"({why}); nothing to explain")
    from fuzzattn.campaigns.file_replay import needs_isolation
    isolated = args.isolate or needs_isolation(record, impl)
    rows = variants(impl, record.case)
    print(f"fuzzattn explain: {args.path.name} on {impl.name}\n  case: {record.case}"
          + ("\n  each variant judged in a worker process of its own" if isolated else ""), flush=True)
    for number, row in enumerate(rows, 1):
        started = time.perf_counter()
        judge_variant(row, isolated)
        # A hang-class file's variants may take minutes each (a hung call is declared only
        # after its deadline): a line per variant on stderr says the triage is moving.
        what = row.factor if row.changed_to == "-" else row.changed_to     # "as recorded"
        print(f"explain {number}/{len(rows)}  {what}  {row.verdict} {row.check[:60]}".rstrip()
              + f"  {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    print(tables.table(("factor", "changed to", "verdict", "check", "error / allowed"),
                       [[r.factor, r.changed_to, r.verdict, r.check, r.numbers] for r in rows],
                       max_width=70))
    print(reading(rows))
    if rows[0].verdict == FAIL and not isolated:
        print(f"needs: {needs(impl, rows)}")
    return 0


def needs(impl, rows: list[Variant]) -> str:
    """The trigger a campaign would report for the recorded case (campaigns/defects.py), from
    the rows' judgements where they judged the same case."""
    from fuzzattn.campaigns.defects import needed_factors, trigger_text
    from fuzzattn.judgement.judge import judge
    judged = {r.case: r.judged for r in rows if r.judged is not None and r.impl is impl}

    def judge_again(case, gradients=True):
        return judged.get(case) or judge(impl, case, gradients=gradients)

    trigger = needed_factors(rows[0].judged, impl.caps, judge_again)
    return trigger_text(trigger)
