"""`gate --changed-since REV`: which implementations changed since a git revision.

A change to the harness itself (what decides what is drawn or how it is judged, or the pins)
counts as every implementation changing; a change to only how results are printed does not.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from fuzzattn.campaigns.regression_file import display_path
from fuzzattn.cli.common import CLIError

# The command line's own presentation modules only change what is printed.
_PRESENTATION_ONLY = ("cli",)
_HARNESS_ROOT_FILES = ("pyproject.toml", "requirements-cpu.txt")


def _git(args, cwd) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True)
    except FileNotFoundError:
        raise CLIError("--changed-since needs git, which is not installed") from None


def _repo_root() -> Path:
    """The git work tree holding this fuzzattn checkout, else the one around the cwd."""
    for candidate in (Path(__file__).resolve().parents[2], Path.cwd()):
        done = _git(["rev-parse", "--show-toplevel"], candidate)
        if done.returncode == 0:
            return Path(done.stdout.decode().strip())
    raise CLIError("--changed-since needs a git repository, and neither the fuzzattn checkout "
                   "nor the current directory is in one")


def changed_files(rev: str) -> set[Path]:
    """Absolute paths changed between REV and the working tree, plus untracked (new) files."""
    if rev.startswith("-"):
        raise CLIError(f"--changed-since {rev!r} is not a revision")
    root = _repo_root()
    done = _git(["diff", "--name-only", "-z", rev, "--"], root)
    if done.returncode != 0:
        why = (done.stderr.decode(errors="replace").strip().splitlines() or ["git diff failed"])[0]
        raise CLIError(f"--changed-since {rev!r}: {why}")
    names = done.stdout.decode().split("\0")
    # A new implementation that is not committed yet is changed too.
    untracked = _git(["ls-files", "--others", "--exclude-standard", "-z"], root)
    if untracked.returncode == 0:
        names += untracked.stdout.decode().split("\0")
    return {(root / name).resolve() for name in names if name}


def harness_files(changed: set[Path]) -> list[Path]:
    import fuzzattn.strategies as strategies
    package = Path(__file__).resolve().parents[1]
    roots = [package, Path(strategies.__file__).resolve().parent]
    presentation = [package / name for name in _PRESENTATION_ONLY]
    extra = {(package.parent / name).resolve() for name in _HARNESS_ROOT_FILES}
    hits = []
    for path in sorted(changed):
        if path in extra:
            hits.append(path)
        elif any(path.is_relative_to(r) for r in roots) and not any(
                path.is_relative_to(p) for p in presentation):
            hits.append(path)
    return hits


def plan(rev: str | None, subjects) -> tuple[set[str], list[str]]:
    """Which subjects get a fuzzing budget, and a note saying why."""
    names = {impl.name for impl in subjects}
    if not rev:
        return names, []
    changed = changed_files(rev)
    harness = harness_files(changed)
    if harness:
        shown = ", ".join(display_path(p) for p in harness[:3]) + (" ..." if len(harness) > 3 else "")
        return names, [f"harness changed since {rev} ({shown}): fuzzing every implementation"]
    chosen = set()
    for impl in subjects:
        outside = impl.spec is not None            # named with --impl: the user asked for it
        if outside or any(Path(f).resolve() in changed for f in impl.source_files()):
            chosen.add(impl.name)
    listed = ", ".join(sorted(chosen)) or "none"
    return chosen, [f"changed since {rev}: fuzzing {listed}; the others are replayed only"]
