"""The package's layers point one way, read from the source with `ast` (function-local imports
included, since those are where cycles hide).

    contract (plain data)  <-  engine  <-  campaigns  <-  cli, pytest_plugin, settings
    strategies depends on the contract only; the engine never imports strategies or kernels;
    no implementation module (kernels/) imports the oracle it is judged by.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Rank of each layer of the fuzzattn package: a module may import its own rank or lower.
LAYERS = {"contract": 0, "engine": 1, "campaigns": 2, "cli": 3, "pytest_plugin": 3, "settings": 3}
STRATEGIES_RANK = 1          # beside the engine: campaigns and the command line may use it


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, at any depth."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # `from fuzzattn import settings` imports a submodule: count it as one
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def rank(module: str) -> int | None:
    """The layer rank of a module name, or None outside the layered code."""
    parts = module.split(".")
    if parts[0] == "strategies":
        return STRATEGIES_RANK
    if parts[0] != "fuzzattn" or len(parts) < 2:
        return None
    return LAYERS.get(parts[1])


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


LAYERED = [p for p in sources("fuzzattn") if p.name != "__init__.py" or p.parent.name != "fuzzattn"]


@pytest.mark.parametrize("path", LAYERED, ids=_id)
def test_a_layer_imports_only_layers_below_it(path):
    own = rank("fuzzattn." + ".".join(path.relative_to(ROOT / "fuzzattn").with_suffix("").parts))
    assert own is not None, f"{_id(path)} is in no layer: add it to LAYERS"
    upward = [(line, m) for line, m in imports(path) if (r := rank(m)) is not None and r > own]
    assert not upward, f"{_id(path)} imports a higher layer: {upward}"


@pytest.mark.parametrize("path", [p for p in LAYERED if p.parts[-2] in ("contract", "engine")],
                         ids=_id)
def test_the_engine_never_imports_kernels_or_strategies(path):
    bad = [(line, m) for line, m in imports(path) if m.split(".")[0] in ("kernels", "strategies")]
    assert not bad, f"{_id(path)} imports {bad}: implementations come from the registry"


@pytest.mark.parametrize("path", sources("strategies"), ids=_id)
def test_strategies_depend_only_on_the_contract(path):
    bad = [(line, m) for line, m in imports(path)
           if m.startswith("fuzzattn") and not m.startswith("fuzzattn.contract")]
    assert not bad, f"{_id(path)} imports {bad}"


@pytest.mark.parametrize("path", sources("kernels"), ids=_id)
def test_no_implementation_imports_the_oracle(path):
    bad = [(line, m) for line, m in imports(path) if m.startswith("fuzzattn.engine.oracle")]
    assert not bad, f"{_id(path)} imports the oracle it is judged by: {bad}"


def test_the_checker_sees_function_local_and_relative_imports(tmp_path):
    """The rules must not be fooled by an import hidden inside a function, or a relative one."""
    fake = tmp_path / "fuzzattn" / "engine" / "probe.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def f():\n    from fuzzattn.cli import main\n"
                    "    from ..campaigns import replay\n    from . import oracle\n")
    found = imports(fake, root=tmp_path)
    assert [(line, m) for line, m in found if (rank(m) or 0) > 1] == [
        (2, "fuzzattn.cli"), (2, "fuzzattn.cli.main"), (3, "fuzzattn.campaigns"),
        (3, "fuzzattn.campaigns.replay")]
    assert (4, "fuzzattn.engine.oracle") in found


@pytest.mark.parametrize("path", LAYERED, ids=_id)
def test_no_module_is_over_about_400_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= 440, f"{_id(path)} has {lines} lines: split it by concept"
