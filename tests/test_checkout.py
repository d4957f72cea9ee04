"""fuzzattn imported straight from this checkout, with no installer's folder mapping, still
finds its kernels and strategies, and finds this checkout's (an old setuptools' editable install,
or another checkout's install, must not change which code is judged)."""
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
