"""Regression fixtures: a shrunk counterexample as a small, readable, replayable JSON file.

Format (schema 1), one object per file, named `<case key>.json` (the case's short hash):

    schema          1
    covers          one line a person can edit: what bug class this fixture guards against
    case            the AttentionCase fields (see fuzzattn/case.py)
    impl            the implementation that failed when the fixture was found
    check           the check that failed (fuzzattn.verdict.CHECKS)
    observed_error  the failing error (null for checks without a number)
    allowed_error   the bound it broke (null likewise)
    where           the failing batch/head/rows, as reported
    inputs_sha256   sha256 of the materialised q, k, v bits: replay refuses to run on drifted inputs
    versions        torch, triton, hypothesis, fuzzattn at the time of finding
    found           the date (YYYY-MM-DD)

Only `schema` and `case` are required, so a fixture can be written by hand from a bug report.
Writes are atomic and create-if-absent (os.link of a complete temporary file), so concurrent
pytest-xdist workers never corrupt or lose a fixture, and the same case is written once.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .case import AttentionCase, CaseError

SCHEMA_VERSION = 1
def default_dir() -> Path:
    """FUZZATTN_FIXTURES_DIR if set (the pytest plugin sets it to <rootdir>/regressions), else
    ./regressions."""
    env = os.environ.get("FUZZATTN_FIXTURES_DIR")
    return Path(env) if env else Path.cwd() / "regressions"

_FIELDS: dict[str, tuple[type, ...]] = {
    "schema": (int,), "covers": (str,), "case": (dict,), "impl": (str,), "check": (str,),
    "observed_error": (int, float, type(None)), "allowed_error": (int, float, type(None)),
    "where": (str,), "inputs_sha256": (str,), "versions": (dict,), "found": (str,),
}
_REQUIRED = ("schema", "case")


class FixtureError(ValueError):
    """A fixture file that cannot be read: the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class Fixture:
    case: AttentionCase
    covers: str = ""
    impl: str | None = None
    check: str | None = None
    observed_error: float | None = None
    allowed_error: float | None = None
    where: str = ""
    inputs_sha256: str | None = None
    versions: dict | None = None
    found: str | None = None
    path: Path | None = None

    def to_json(self) -> str:
        data = {"schema": SCHEMA_VERSION, "covers": self.covers, "case": self.case.to_dict(),
                "impl": self.impl, "check": self.check, "observed_error": self.observed_error,
                "allowed_error": self.allowed_error, "where": self.where,
                "inputs_sha256": self.inputs_sha256, "versions": self.versions, "found": self.found}
        return json.dumps({k: v for k, v in data.items() if v is not None}, indent=2) + "\n"

    def replay_command(self) -> str:
        path = self.path if self.path is not None else f"regressions/{self.case.key()}.json"
        return f"fuzzattn replay {display_path(path)}"


def display_path(path) -> str:
    """A path relative to the cwd when it is under it: short, and what a user would type."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def parse(data: Any, path: Path | None = None) -> Fixture:
    """Validate parsed JSON; every error is one line naming the field."""
    where = f"{path}: " if path else ""
    if not isinstance(data, dict):
        raise FixtureError(f"{where}a fixture must be a JSON object, got {type(data).__name__}")
    for name in data:
        if name not in _FIELDS:
            raise FixtureError(f"{where}unknown field {name!r} (known: {', '.join(_FIELDS)})")
    for name in _REQUIRED:
        if name not in data:
            raise FixtureError(f"{where}missing required field {name!r}")
    for name, value in data.items():
        kinds = _FIELDS[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise FixtureError(f"{where}field {name!r} should be {names}, got {value!r}")
    if data["schema"] != SCHEMA_VERSION:
        raise FixtureError(f"{where}unsupported schema version {data['schema']!r} "
                           f"(this fuzzattn reads schema {SCHEMA_VERSION})")
    try:
        case = AttentionCase.from_dict(data["case"])
    except (CaseError, TypeError) as exc:
        raise FixtureError(f"{where}field 'case': {exc}") from None
    fields = {k: v for k, v in data.items() if k not in ("schema", "case")}
    return Fixture(case=case, path=path, **fields)


def load(path: str | os.PathLike) -> Fixture:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise FixtureError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FixtureError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    return parse(data, path)


def discover(directory: str | os.PathLike | None = None) -> list[Path]:
    directory = Path(directory) if directory is not None else default_dir()
    return sorted(directory.glob("*.json")) if directory.is_dir() else []


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)        # without importing: importing triton fixes its backend
        except PackageNotFoundError:
            return "not installed"

    import torch
    from . import __version__
    return {"torch": torch.__version__, "triton": installed("triton"),
            "hypothesis": installed("hypothesis"), "fuzzattn": __version__}


def write(fixture: Fixture, directory: str | os.PathLike | None = None) -> tuple[Path, bool]:
    """Write atomically unless a fixture for this case exists; returns (path, newly_written)."""
    directory = Path(directory) if directory is not None else default_dir()
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{fixture.case.key()}.json"
    if final.exists():
        return final, False
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(fixture.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, final)     # atomic create-if-absent: a complete file or none
            return final, True
        except FileExistsError:
            return final, False
    finally:
        os.unlink(tmp)


def from_report(report, inputs_sha256: str, covers: str = "") -> Fixture:
    """A fixture recording the first failure of a judge Report."""
    failure = report.first_failure
    return Fixture(case=report.case, covers=covers or f"{report.impl} failed the {failure.check} "
                   "check (found by fuzzing; edit this line to name the bug class)",
                   impl=report.impl, check=failure.check, observed_error=failure.error,
                   allowed_error=failure.allowed, where=failure.where,
                   inputs_sha256=inputs_sha256, versions=versions(),
                   found=datetime.date.today().isoformat())
