"""fuzzattn.kernels and fuzzattn.strategies found in a source checkout without the installer's help.

An install maps the repository's top-level kernels/ and strategies/ folders into the package.
Imported straight from a checkout (the checkout on sys.path, never installed, installed by a
setuptools too old to map folders in editable mode, or another checkout installed), the package
would not find them, or would find another checkout's; this finder makes it find its own.
"""
import importlib.abc
import importlib.util
import sys
from pathlib import Path

FOLDERS = ("kernels", "strategies")


class _BesideThePackage(importlib.abc.MetaPathFinder):
    def __init__(self, package: str, root: Path):
        self.names = {f"{package}.{folder}": root / folder for folder in FOLDERS}

    def find_spec(self, name, path=None, target=None):
        folder = self.names.get(name)
        if folder is None or not (folder / "__init__.py").is_file():
            return None
        return importlib.util.spec_from_file_location(
            name, folder / "__init__.py", submodule_search_locations=[str(folder)])


def find_folders_beside(package: str) -> None:
    """When `package` is imported from a checkout (its folders sit beside it, not inside it, as
    they do once installed), put a finder for them first on sys.meta_path."""
    here = Path(sys.modules[package].__file__).resolve().parent
    root = here.parent
    if any((here / folder).exists() for folder in FOLDERS) or not (root / "pyproject.toml").is_file():
        return
    if any(isinstance(f, _BesideThePackage) for f in sys.meta_path):
        return
    if all((root / folder / "__init__.py").is_file() for folder in FOLDERS):
        sys.meta_path.insert(0, _BesideThePackage(package, root))
