"""Regression files: a shrunk counterexample as a small, readable, replayable JSON file.

Format (schema 2), one object per file, named `<case key>.json` (the case's short hash):

    schema             2 (schema 1 files, whose case calls its data seed "seed", still load)
    covers             one line a person can edit: what bug class this file guards against
    case               the AttentionCase fields (see fuzzattn/contract/case.py), its configuration too
    impl               the implementation that failed when the file was written
    impl_spec          how `--impl` finds it when it is not registered (path/file.py:NAME or
                       module:NAME); a file under the project root, the directory holding the
                       regressions directory, is written relative to that root, so the tree
                       replays wherever it is copied (`replay_spec`); absolute paths still load
    check              the check that failed (fuzzattn.judging.verdict.CHECKS)
    observed_error     the failing error (null for checks without a number)
    allowed_error      the bound it broke (null likewise)
    where              the failing batch/head/rows, as reported
    inputs_sha256      sha256 of the materialised q, k, v bits: replay refuses to run on drifted inputs
    versions           torch, triton, hypothesis, fuzzattn at the time of finding
    found              the date (YYYY-MM-DD)
    cause              the defect's cause as one line (campaigns/defects.py: its trigger, or with
                       none its symptom): a later run, or another worker, that finds the same
                       cause of the same implementation keeps this file and writes none
    expected_failures  {impl name: {"reason": ..., "upstream": ..., "device": ...}}: implementations
                       known to fail this case (an upstream defect, say). Replays report them as
                       expected failures, strictly: one that starts passing fails the run, so the
                       entry gets removed once the defect is fixed. "device" (optional: "cpu" or
                       "cuda") limits the expectation to runs on that device type: the default
                       `sdpa` dispatches to cuDNN on CUDA and fails there, while on the CPU the
                       same name must pass like any regression. An entry for an implementation
                       not registered here (sdpa_cudnn on a CPU machine) is not replayed.

Only `schema` and `case` are required, so a file can be written by hand from a bug report.
Reading never takes a run down: whatever a file holds (not UTF-8, not JSON, nested a hundred
thousand deep, absurd sizes or seeds, sizes over the memory budget), `load` raises one
RegressionFileError naming the file and the field, and the caller reports that file as failed.

Writes are atomic and create-if-absent (os.link of a complete temporary file), so concurrent
pytest-xdist workers never corrupt or lose a file, and the same case is written once. When the
directory cannot be written (read-only checkout, no permission), the file goes to a fallback
directory under the system temp dir, and the caller prints where.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from fuzzattn.campaigns.covers import written as written_covers
from fuzzattn.contract.case import AttentionCase, CaseError
from fuzzattn.inputs.budget import CaseTooLargeError, check_budget

SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
MAX_FILE_BYTES = 1 << 20          # a regression file is a few hundred bytes; 1 MiB is not one
FALLBACK_DIR = Path(tempfile.gettempdir()) / "fuzzattn-regressions"

_FIELDS: dict[str, tuple[type, ...]] = {
    "schema": (int,), "covers": (str,), "case": (dict,), "impl": (str,), "impl_spec": (str,),
    "check": (str,), "observed_error": (int, float, type(None)),
    "allowed_error": (int, float, type(None)), "where": (str,), "inputs_sha256": (str,),
    "versions": (dict,), "found": (str,), "expected_failures": (dict,), "cause": (str,),
}
_REQUIRED = ("schema", "case")


class RegressionFileError(ValueError):
    """A regression file that cannot be used: the message names the file and the field."""


_run_default: Path | None = None      # set by the pytest plugin: <rootdir>/<fuzzattn_regressions>


def default_dir() -> Path:
    """Where regression files are read and written when no directory is given: the
    FUZZATTN_REGRESSIONS_DIR variable if set, else the directory the run configured (the pytest
    plugin: <rootdir>/regressions), else ./regressions."""
    env = os.environ.get("FUZZATTN_REGRESSIONS_DIR")
    if env:
        return Path(env)
    return _run_default if _run_default is not None else Path.cwd() / "regressions"


def set_default_dir(directory: Path | None) -> Path | None:
    """Set the run's default directory; returns the previous one (to restore it)."""
    global _run_default
    previous, _run_default = _run_default, directory
    return previous


def display_path(path) -> str:
    """A path relative to the cwd when it is under it: short, and what a user would type."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def portable_spec(spec: str | None, directory: Path) -> str | None:
    """The spec as a file in `directory` records it: a kernel file under the project root (the
    directory's parent) relative to it, with '/' separators; anything else as it was given."""
    from fuzzattn.run.loader import is_file_target     # with torch: not needed to read a file
    target, sep, name = (spec or "").rpartition(":")
    if not sep or not is_file_target(target):
        return spec
    path = Path(target).expanduser().resolve()
    try:
        return f"{path.relative_to(Path(directory).resolve().parent).as_posix()}:{name}"
    except ValueError:
        return f"{path}:{name}"


def replay_command(path, cli_name: str | None) -> str:
    """The one builder of the replay hint: the file and the `--impl` that finds the
    implementation again, so the command works as printed."""
    return f"fuzzattn replay {display_path(path)}" + (f" --impl {cli_name}" if cli_name else "")


EXPECTATION_DEVICES = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class ExpectedFailure:
    reason: str
    upstream: str = ""
    device: str = ""            # "" on every device, else only on this device type

    def applies_on(self, device_type: str) -> bool:
        return not self.device or self.device == device_type

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        if not self.device:
            del data["device"]      # files without device-limited entries read as before
        return data


@dataclasses.dataclass(frozen=True)
class RegressionFile:
    case: AttentionCase
    covers: str = ""
    impl: str | None = None
    impl_spec: str | None = None
    check: str | None = None
    observed_error: float | None = None
    allowed_error: float | None = None
    where: str = ""
    inputs_sha256: str | None = None
    versions: dict | None = None
    found: str | None = None
    expected_failures: dict[str, ExpectedFailure] = dataclasses.field(default_factory=dict)
    cause: str | None = None
    path: Path | None = None

    def expected_failure(self, impl: str, device_type: str) -> ExpectedFailure | None:
        """The entry expecting `impl` to fail on this device type, or None."""
        entry = self.expected_failures.get(impl)
        return entry if entry is not None and entry.applies_on(device_type) else None

    def replay_spec(self) -> str | None:
        """impl_spec as `--impl` takes it here: a relative file path resolved against the
        project root (the parent of the file's directory), shown from the working directory."""
        from fuzzattn.run.loader import is_file_target
        target, sep, name = (self.impl_spec or "").rpartition(":")
        if not sep or self.path is None or not is_file_target(target) or Path(target).is_absolute():
            return self.impl_spec
        return f"{display_path(Path(self.path).resolve().parent.parent / target)}:{name}"

    def to_json(self) -> str:
        data = {"schema": SCHEMA_VERSION, "covers": self.covers, "case": self.case.to_dict(),
                "impl": self.impl, "impl_spec": self.impl_spec, "check": self.check,
                "observed_error": self.observed_error, "allowed_error": self.allowed_error,
                "where": self.where, "inputs_sha256": self.inputs_sha256,
                "versions": self.versions, "found": self.found, "cause": self.cause,
                "expected_failures": {name: x.to_dict() for name, x in
                                      self.expected_failures.items()} or None}
        return json.dumps({k: v for k, v in data.items() if v is not None}, indent=2) + "\n"

    @property
    def name(self) -> str:
        return self.path.name if self.path is not None else f"{self.case.key()}.json"


def parse(data: Any, path: Path | None = None) -> RegressionFile:
    """Validate parsed JSON; every error is one line naming the file and the field."""
    where = f"{path}: " if path else ""
    if not isinstance(data, dict):
        raise RegressionFileError(f"{where}a regression file must be a JSON object, got {type(data).__name__}")
    for name in data:
        if name not in _FIELDS:
            raise RegressionFileError(f"{where}unknown field {name!r} (known: {', '.join(_FIELDS)})")
    for name in _REQUIRED:
        if name not in data:
            raise RegressionFileError(f"{where}missing required field {name!r}")
    for name, value in data.items():
        kinds = _FIELDS[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise RegressionFileError(f"{where}field {name!r} should be {names}, got {_short(value)}")
    if data["schema"] not in READABLE_SCHEMAS:
        raise RegressionFileError(f"{where}unsupported schema version {_short(data['schema'])} "
                                  f"(this fuzzattn reads schemas {READABLE_SCHEMAS})")
    try:
        case = AttentionCase.from_dict(data["case"])
        check_budget(case)
    except (CaseError, TypeError, CaseTooLargeError) as exc:
        raise RegressionFileError(f"{where}field 'case': {exc}") from None
    expected = {}
    for impl, entry in data.get("expected_failures", {}).items():
        if not isinstance(entry, dict) or not isinstance(entry.get("reason"), str) or \
                set(entry) - {"reason", "upstream", "device"} or \
                not isinstance(entry.get("upstream", ""), str):
            raise RegressionFileError(f"{where}field 'expected_failures.{impl}' should be "
                                      "{\"reason\": str, \"upstream\": str, \"device\": str}")
        if entry.get("device", "") not in ("",) + EXPECTATION_DEVICES:
            raise RegressionFileError(f"{where}field 'expected_failures.{impl}.device' should be "
                                      f"one of {EXPECTATION_DEVICES}, got {_short(entry['device'])}")
        expected[impl] = ExpectedFailure(**entry)
    fields = {k: v for k, v in data.items() if k not in ("schema", "case", "expected_failures")}
    return RegressionFile(case=case, path=path, expected_failures=expected, **fields)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load(path: str | os.PathLike) -> RegressionFile:
    """Read and validate one file; any problem is one RegressionFileError naming the file."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise RegressionFileError(f"{path}: {path.stat().st_size} bytes, over the "
                                      f"{MAX_FILE_BYTES} a regression file may have")
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise RegressionFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise RegressionFileError(f"{path}: not UTF-8 text (byte {exc.start}): not a regression file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        # json's own messages may end in "at" ("Unterminated string starting at"): the place
        # follows a colon, as in str(exc), never a second "at"
        raise RegressionFileError(f"{path}: not valid JSON: {exc.msg}: line {exc.lineno} "
                                  f"column {exc.colno}") from None
    except RecursionError:
        raise RegressionFileError(f"{path}: JSON nested too deeply to be a regression file") from None
    return parse(data, path)


def discover(directory: str | os.PathLike | None = None) -> list[Path]:
    """The regression files of a directory (hidden files, such as half-written temporaries, excluded)."""
    directory = Path(directory) if directory is not None else default_dir()
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.json") if not p.name.startswith("."))


def loadable(directory: str | os.PathLike | None = None) -> list[tuple[Path, "RegressionFile"]]:
    """(path, record) of each regression file of a directory that loads. One that does not is
    left to its own failing item (`FILE::unreadable`) and replay row, so code that reads every
    file at import (a test module's parameters) never turns it into a collection error."""
    found = []
    for path in discover(directory):
        try:
            found.append((path, load(path)))
        except RegressionFileError:
            pass
    return found


@dataclasses.dataclass(frozen=True)
class Written:
    path: Path
    new: bool                       # False: a file for this case was already there
    fallback_reason: str = ""       # why it is not in the directory asked for


def write(record: RegressionFile, directory: str | os.PathLike | None = None) -> Written:
    """Write atomically unless a file for this case exists; falls back to FALLBACK_DIR when the
    directory cannot be written, so a counterexample is never lost."""
    directory = Path(directory) if directory is not None else default_dir()
    try:
        path, new = _write_in(record, directory)
        return Written(path, new)
    except OSError as exc:
        reason = f"{display_path(directory)} is not writable ({exc.strerror or exc})"
    path, new = _write_in(record, FALLBACK_DIR)
    return Written(path, new, reason)


def _write_in(record: RegressionFile, directory: Path) -> tuple[Path, bool]:
    directory.mkdir(parents=True, exist_ok=True)
    record = dataclasses.replace(record, impl_spec=portable_spec(record.impl_spec, directory))
    final = directory / f"{record.case.key()}.json"
    if final.exists():
        return final, False
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(record.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, final)     # atomic create-if-absent: a complete file or none
            return final, True
        except FileExistsError:
            return final, False
    finally:
        os.unlink(tmp)


def from_judged(judged, covers: str = "") -> RegressionFile:
    """The file recording the first failure of a JudgedCase (which carries the inputs' sha256
    and the versions, so nothing is materialised again to write it)."""
    failure = judged.first_failure
    return RegressionFile(case=judged.case,
                          covers=covers or written_covers(judged.impl, failure.check, judged.case),
                          impl=judged.impl,
                          impl_spec=judged.cli_name if judged.cli_name != judged.impl else None,
                          check=failure.check, observed_error=failure.error,
                          allowed_error=failure.allowed, where=failure.where,
                          inputs_sha256=judged.inputs_sha256, versions=judged.versions,
                          found=datetime.date.today().isoformat())
