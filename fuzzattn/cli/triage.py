"""`fuzzattn triage DIR`: group a directory's regression files by cause, and prune duplicates.

A team that fuzzed before defects were grouped by cause, or merged directories from several
machines, holds many files per bug. Triage judges each file's case again on the implementation
it records (or only the --impl ones), finds its cause as a campaign does (campaigns/defects.py:
the trigger its case needs, the cure test for a case of a cause already met), and prints one row
per cause with its files. The oldest file of a cause is the one kept, as campaigns decide it
(campaigns/cause_files.py); `--prune` removes the others and records the cause in the kept one.

Files whose case passes now, cannot run here, or record a failure that ends the process judging
it (a hang, segfault or device fault: triage judges in-process and leaves those to `replay`) are
listed apart and never removed. Exit status 0 once the table is printed (a diagnosis), 2 for a
directory or implementation that cannot be used.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from fuzzattn.cli import common, tables


def add_parser(commands) -> None:
    p = commands.add_parser("triage", help="group regression files by cause; prune duplicates",
                            description="Judge every regression file of a directory again, group "
                                        "the files by the cause of their failure (the change that "
                                        "cures their case) and list each cause once.")
    p.add_argument("directory", type=Path, metavar="DIR", help="a directory of regression files")
    p.add_argument("--impl", action="append", default=[], metavar=common.IMPL_METAVAR,
                   help="triage only the files of these implementations; repeatable")
    p.add_argument("--prune", action="store_true",
                   help="remove every file but the oldest of each cause, and record the cause in "
                        "the file kept")
    p.set_defaults(run=run)


@dataclasses.dataclass
class Cause:
    impl: str
    defect: object              # campaigns.defects.Defect: its trigger and checks
    files: list[Path]           # oldest first: the first is kept


def _implementation(record, given: dict, cache: dict):
    """The implementation a file records (None: not among the --impl ones)."""
    if given:
        return given.get(record.impl)
    spec = record.impl_spec or record.impl
    if spec not in cache:
        cache[spec] = common.resolve(spec)
    return cache[spec]


def triage(paths: list[Path], given: dict) -> tuple[list[Cause], list[tuple[Path, str]]]:
    """(causes, set apart): every file's cause, and the files not grouped with why."""
    from fuzzattn.campaigns import cause_files
    from fuzzattn.campaigns.campaign import judge_once
    from fuzzattn.campaigns.defects import DefectBook
    from fuzzattn.campaigns.found import Counterexample
    from fuzzattn.campaigns.regression_file import RegressionFileError, Written, load
    from fuzzattn.campaigns.file_replay import needs_isolation
    books: dict[str, DefectBook] = {}
    causes: dict[int, Cause] = {}
    apart: list[tuple[Path, str]] = []
    cache: dict = {}
    for path in sorted(paths, key=cause_files.age):     # the oldest of a cause is kept
        try:
            record = load(path)
        except RegressionFileError as exc:
            apart.append((path, f"unreadable: {common.flattened(exc)}"))
            continue
        impl = _implementation(record, given, cache)
        if impl is None:
            continue
        if needs_isolation(record, impl):
            apart.append((path, f"records a {record.check}: judged isolated by replay, "
                                "not triaged"))
            continue
        why = impl.caps.why_not(record.case)
        judged = None if why else judge_once(impl, record.case)
        if judged is None or judged.skipped or judged.refused:
            apart.append((path, f"cannot run here: {why or judged.skipped or judged.refused}"))
            continue
        if judged.passed:
            apart.append((path, f"passes now on {impl.name}"))
            continue

        def variant_judge(case, gradients, impl=impl):
            return judge_once(impl, case, gradients=gradients)

        book = books.setdefault(impl.name, DefectBook(impl.caps, variant_judge))
        owner, alone = book.assign(judged)
        if owner is None:
            owner = book.add(Counterexample(judged, Written(path, new=False)), variant_judge)
        elif alone:
            owner.showed(judged)
        cause = causes.setdefault(id(owner), Cause(impl.name, owner, []))
        cause.files.append(path)
    return list(causes.values()), apart


def _prune(causes: list[Cause]) -> int:
    """Remove each cause's files but the first (oldest), recording the cause in that one."""
    from fuzzattn.campaigns import cause_files, regression_file
    removed = 0
    for cause in causes:
        kept, *duplicates = cause.files
        record = regression_file.load(kept)
        if record.cause != cause.defect.signature:
            cause_files.rewrite(kept, dataclasses.replace(record, cause=cause.defect.signature,
                                                          path=None))
        for path in duplicates:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def run(args) -> int:
    from fuzzattn.cli.replay import file_paths
    if not args.directory.is_dir():
        raise common.CLIError(f"{args.directory}: not a directory of regression files")
    given = {impl.name: impl for impl in (common.resolve(spec) for spec in args.impl)}
    paths = file_paths([args.directory])
    causes, apart = triage(paths, given)
    rows = [[c.impl, i, c.defect.needs(), ", ".join(c.defect.checks), len(c.files),
             c.files[0].name] for i, c in enumerate(causes, 1)]
    print(tables.table(("impl", "#", "needs", "checks", "files", "kept"), rows, max_width=60))
    for path, why in apart:
        print(f"  {path.name}: {why}")
    duplicates = sum(len(c.files) - 1 for c in causes)
    grouped = sum(len(c.files) for c in causes)
    summary = (f"{grouped} failing file(s) of {len(paths)}: {len(causes)} cause(s), "
               f"{duplicates} duplicate file(s)")
    if args.prune:
        print(f"{summary}; removed {_prune(causes)}")
    else:
        print(summary + ("; --prune removes them" if duplicates else ""))
    return 0
