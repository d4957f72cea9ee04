"""Code says why, not when or where: no machine names or dates in the package, and every file a
comment points to exists.

Where and when a figure was measured belongs in docs/CALIBRATION.md, which the code links to.
The exceptions are known-defect records (fuzzattn/contract/known_defects.py and the kernels'
KnownDefect entries), which may name the hardware a defect shows on.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = sorted(p for folder in ("fuzzattn", "kernels", "strategies")
                 for p in (ROOT / folder).rglob("*.py"))
ALSO_READ = [ROOT / "conftest.py", ROOT / "pyproject.toml", ROOT / ".ci" / "run"]

MACHINE = re.compile(r"\b(gh200|[hb]200|h100|h800|a100|a800|a10g|l40s?|v100|mi[23]\d0x?|rtx ?\d{4})\b",
                     re.IGNORECASE)
DATE = re.compile(r"\b20[0-9]{2}-[01][0-9]\b")
KNOWN_DEFECTS_MODULE = "fuzzattn/contract/known_defects.py"

# A repository-relative path: a top-level folder, then a name; not part of a longer path
# (`.fuzzattn/examples`, `~/fuzzattn/x`) or of a dotted module name.
FOLDERS = ("fuzzattn", "kernels", "strategies", "benchmarks", "tests", "examples", "docs", ".ci")
PATH = re.compile(r"(?<![\w./~-])(?:%s)/(?:[\w./-]*[\w/])?" % "|".join(re.escape(f) for f in FOLDERS))
# Regression files are named by a 12-hex-digit hash; docstrings also show made-up examples.
REGRESSION = re.compile(r"(?<![\w./~-])regressions/[0-9a-f]{12}\.json\b")
# A module file named alone (lower case: FILE.py in a usage line is a placeholder).
BARE_PY = re.compile(r"(?<![\w./~-])([a-z_][a-z0-9_]*)\.py\b")
ANCHOR = re.compile(r"docs/CALIBRATION\.md#([\w-]+)")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _defect_record_lines(path: Path) -> set[int]:
    """Lines inside a KnownDefect(...) call or a known_defects= argument."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        spans = []
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name == "KnownDefect":
                spans.append(node)
            spans += [kw.value for kw in node.keywords if kw.arg == "known_defects"]
        for span in spans:
            lines.update(range(span.lineno, span.end_lineno + 1))
    return lines


def _hits(path: Path) -> list[str]:
    rel = _rel(path)
    if rel == KNOWN_DEFECTS_MODULE:
        return []
    allowed = _defect_record_lines(path) if path.suffix == ".py" else set()
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if number in allowed:
            continue
        if MACHINE.search(line) or DATE.search(line):
            found.append(f"{rel}:{number}: {line.strip()}")
    return found


@pytest.mark.parametrize("path", PACKAGE + ALSO_READ, ids=_rel)
def test_no_machine_names_or_dates(path):
    assert _hits(path) == [], "say why, and move where/when to docs/CALIBRATION.md"


def test_the_scan_sees_a_machine_and_a_date(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("X = 1  # measured on the H200\nY = 2  # 2026-11-30\nZ = KnownDefect('A100')\n")
    assert MACHINE.search("on an H200") and DATE.search("(2026-12-03)")
    assert _defect_record_lines(probe) == {3}


def _paths_named(text: str) -> set[str]:
    return {m.rstrip("./") for m in PATH.findall(text)} | set(REGRESSION.findall(text))


@pytest.mark.parametrize("path", PACKAGE + ALSO_READ, ids=_rel)
def test_named_files_exist(path):
    text = path.read_text()
    missing = sorted(p for p in _paths_named(text) if not (ROOT / p).exists())
    assert missing == [], f"{_rel(path)} names files that do not exist"
    basenames = {p.name for p in ROOT.rglob("*.py") if ".venv" not in p.parts}
    unknown = sorted(name + ".py" for name in set(BARE_PY.findall(text))
                     if name + ".py" not in basenames)
    assert unknown == [], f"{_rel(path)} names modules that do not exist"


def test_calibration_links_have_sections():
    page = (ROOT / "docs" / "CALIBRATION.md").read_text()
    sections = set(re.findall(r"^## ([\w-]+)$", page, re.MULTILINE))
    linked = {m for p in PACKAGE + ALSO_READ for m in ANCHOR.findall(p.read_text())}
    assert linked and linked <= sections, sorted(linked - sections)


def test_the_path_pattern_skips_look_alikes():
    text = ("see kernels/flex.py and benchmarks/, not .fuzzattn/examples nor fuzzattn.kernels.x; "
            "regressions/abc123.json is made up, regressions/0123456789ab.json is not")
    assert _paths_named(text) == {"kernels/flex.py", "benchmarks", "regressions/0123456789ab.json"}
