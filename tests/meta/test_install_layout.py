"""What an install puts on the import path, and what a checkout finds without one.

Installed, fuzzattn claims one import name: the repository's kernels/ and strategies/ become
fuzzattn.kernels and fuzzattn.strategies, never the generic top-level `kernels` and `strategies`
a user's own code may hold. Imported straight from this checkout, with no installer's folder
mapping, it still finds its kernels and strategies, and this checkout's (an old setuptools'
editable install, or another checkout's install, must not change which code is judged)."""
import ast
import subprocess
import zipfile
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_without_the_install_mapping_finds_its_own_folders():
    # -S: no .pth file runs, so the editable install's finder is absent; the site-packages
    # folders still give torch, triton and hypothesis.
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    code = ("import fuzzattn, fuzzattn.kernels.mutants, fuzzattn.strategies as s;"
            "print(s.__file__); print(fuzzattn.kernels.mutants.__file__)")
    env = {"PYTHONPATH": ":".join([str(ROOT), *sorted(paths)]), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(ROOT / "strategies" / "__init__.py"),
                                   str(ROOT / "kernels" / "mutants" / "__init__.py")]


def test_the_wheel_installs_one_top_level_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("fuzzattn-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"fuzzattn", wheel.name.split("-py")[0] + ".dist-info"}
    assert "fuzzattn/kernels/__init__.py" in names and "fuzzattn/strategies/__init__.py" in names
    # every subpackage of the engine is a real package with a docstring saying its job
    for folder in sorted(p for p in (ROOT / "fuzzattn").iterdir() if p.is_dir() and p.name != "__pycache__"):
        init = f"fuzzattn/{folder.name}/__init__.py"
        assert init in names, init
        assert ast.get_docstring(ast.parse((folder / "__init__.py").read_text())), init


def test_an_installed_fuzzattn_leaves_the_generic_names_free(tmp_path):
    # Outside the checkout (cwd and PYTHONPATH without it), as a user's project imports.
    code = ("import importlib.util as u, fuzzattn.kernels, fuzzattn.strategies;"
            "print(u.find_spec('kernels'), u.find_spec('strategies'))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["None", "None"], done.stdout
