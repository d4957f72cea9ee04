"""One regression file per cause: a defect's file is written when its shrunk case is found,
before its cause is known; once it is (campaigns/defects.py), the file records it and is kept only
when no other file of the directory holds the same implementation's same cause.

Which file stays is decided the same way by every process that looks: the oldest (modification
time, then name). So a later run that meets a cause already saved keeps the saved file and
removes its own, and two workers that saved the same cause side by side keep the same one of
the two, whichever looks first.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from fuzzattn.campaigns import covers, regression_file


def rewrite(path: Path, record: regression_file.RegressionFile) -> None:
    """Replace the file atomically (a reader sees the old file or the new one, never half)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(record.to_json())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def age(path: Path) -> tuple:
    try:
        return path.stat().st_mtime_ns, path.name
    except OSError:
        return float("inf"), path.name


def same_cause(directory: Path, impl: str, cause: str) -> list[Path]:
    """The files of `directory` recording `cause` for `impl`, oldest first."""
    found = [path for path, record in regression_file.loadable(directory)
             if record.impl == impl and record.cause == cause]
    return sorted(found, key=age)


def settle(counterexample, cause: str, *, duplicate_of=None) -> None:
    """Settle the file a counterexample wrote in this run: removed when it is a `duplicate_of`
    another counterexample of this run's cause, or when an older file holds the same cause
    (the counterexample then points at that file); else it records its cause."""
    written = counterexample.written
    if written is None or not written.new or written.fallback_reason:
        return
    if duplicate_of is not None:
        kept = getattr(duplicate_of.written, "path", None)
        if kept is not None and kept != written.path:
            with contextlib.suppress(OSError):
                os.unlink(written.path)
            counterexample.written = duplicate_of.written
        return
    try:
        record = regression_file.load(written.path)
        rewrite(written.path, covers.with_cause(record, cause))      # covers written from it
        holders = same_cause(written.path.parent, record.impl, cause)
    except (OSError, regression_file.RegressionFileError):
        return                          # the file stays as written: never lose a counterexample
    if holders and holders[0] != written.path:
        with contextlib.suppress(OSError):
            os.unlink(written.path)
        counterexample.written = regression_file.Written(holders[0], new=False)


def discard(counterexample) -> None:
    """Remove the file a counterexample wrote in this run (its defect was folded into others)."""
    written = counterexample.written
    if written is not None and written.new and not written.fallback_reason:
        with contextlib.suppress(OSError):
            os.unlink(written.path)
        counterexample.written = None
