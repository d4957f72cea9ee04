"""What an install puts on the import path.

Installed, fuzzattn claims one import name: the repository's kernels/ and strategies/ become
fuzzattn.kernels and fuzzattn.strategies, never the generic top-level `kernels` and `strategies`
a user's own code may hold. The installer maps them (pyproject.toml's package-dir), for a wheel
as for an editable install; the package itself adds nothing to Python's import system."""
import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Run in a fresh interpreter from outside the checkout: what each package is imported from,
# whether the generic names stay free, and whether importing fuzzattn touched the import system.
PROBE = """\
import importlib.util as u, sys
hooks = (list(sys.meta_path), list(sys.path_hooks))
import fuzzattn, fuzzattn.kernels, fuzzattn.strategies
for module in (fuzzattn, fuzzattn.kernels, fuzzattn.strategies):
    print(module.__file__)
print(u.find_spec('kernels'), u.find_spec('strategies'))
print('unchanged' if hooks == (list(sys.meta_path), list(sys.path_hooks)) else 'changed')
"""


def probe(cwd: Path, **env) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of what the build reads: setuptools builds in the source
    folder (build/, *.egg-info), where two xdist workers' builds would collide."""
    source, folder = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("fuzzattn", "kernels", "strategies"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(folder), str(source)], check=True, capture_output=True, timeout=300)
    [built] = folder.glob("fuzzattn-*.whl")
    return built


def test_the_wheel_installs_one_top_level_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"fuzzattn", wheel.name.split("-py")[0] + ".dist-info"}
    assert "fuzzattn/kernels/__init__.py" in names and "fuzzattn/strategies/__init__.py" in names
    # every subpackage of the engine is a real package with a docstring saying its job
    for folder in sorted(p for p in (ROOT / "fuzzattn").iterdir() if p.is_dir() and p.name != "__pycache__"):
        init = f"fuzzattn/{folder.name}/__init__.py"
        assert init in names, init
        assert ast.get_docstring(ast.parse((folder / "__init__.py").read_text())), init


def test_the_installed_wheel_finds_its_kernels_and_strategies(wheel, tmp_path):
    """Installed from the wheel into a folder of its own, placed first on the path: every
    package comes from there, none from this checkout."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--target", str(site), str(wheel)], check=True, capture_output=True, timeout=300)
    *files, generic, hooks = probe(tmp_path, PYTHONPATH=str(site))
    assert files == [str(site / "fuzzattn" / "__init__.py"),
                     str(site / "fuzzattn" / "kernels" / "__init__.py"),
                     str(site / "fuzzattn" / "strategies" / "__init__.py")]
    assert (generic, hooks) == ("None None", "unchanged")


def test_the_editable_install_finds_this_checkouts_kernels_and_strategies(tmp_path):
    """`pip install -e .` (.ci/run, the README; conftest.py stops the suite without it):
    imported from anywhere, fuzzattn and the two folders it maps are this checkout's."""
    *files, generic, hooks = probe(tmp_path)
    assert files == [str(ROOT / "fuzzattn" / "__init__.py"), str(ROOT / "kernels" / "__init__.py"),
                     str(ROOT / "strategies" / "__init__.py")]
    # setuptools' own finder (added by the install's .pth file at start-up) is the only one
    assert (generic, hooks) == ("None None", "unchanged")
