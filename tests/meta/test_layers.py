"""The package's structure, read from the source with `ast` (function-local imports included,
since those are where cycles hide).

    contract <- platform, triton_interpreter <- inputs <- judging (the rule, the oracle) <- run
             <- gradients <- judgement (one case: runs, references, rule) <- relations
             <- isolation, strategies <- campaigns <- cli, pytest_plugin, settings

Each subpackage has one rank, with no exception for a module inside it. A module imports its own
layer or lower; no two modules import each other, directly or around a loop (`import fuzzattn`
from inside the package included: the root imports the public API), and no two subpackages do;
fuzzattn.strategies depends on the contract only; the engine never imports the kernels; no
implementation module imports the oracle it is judged by; no module is over 400 lines, and no
function over 80 without a docstring line saying why ("Long because ...").
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Rank of each part of the fuzzattn package: a module may import its own rank or lower.
LAYERS = {"contract": 0, "platform": 1, "triton_interpreter": 1, "inputs": 2,
          "judging": 3, "run": 4, "gradients": 5, "judgement": 6, "relations": 7, "isolation": 8,
          "strategies": 8, "campaigns": 9, "cli": 10, "pytest_plugin": 10, "pytest_regressions": 10,
          "pytest_watched": 10, "settings": 10}
ENGINE = ("contract", "platform", "triton_interpreter", "inputs", "run", "judging", "gradients",
          "judgement", "relations", "isolation")
LONGEST_FUNCTION = 80          # lines, unless its docstring has a line starting "Long because"
# Folders installed inside the package (pyproject.toml's package-dir).
MAPPED = {"kernels": "fuzzattn.kernels", "strategies": "fuzzattn.strategies"}


def module_name(path: Path, root: Path = ROOT) -> str:
    """The installed module name of a source file (kernels/x.py -> fuzzattn.kernels.x)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    name = ".".join(parts)
    top = parts[0]
    return MAPPED[top] + name[len(top):] if top in MAPPED else name


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, at any depth."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own = module_name(path, root)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
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
    if parts[0] != "fuzzattn" or len(parts) < 2:
        return None
    return LAYERS.get(parts[1])


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


PACKAGE = sources("fuzzattn") + sources("kernels") + sources("strategies")
LAYERED = [p for p in sources("fuzzattn") + sources("strategies") if p != ROOT / "fuzzattn/__init__.py"]


def import_graph(paths: list[Path], root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package modules it imports by name. `from pkg import mod` names pkg.mod;
    `from pkg import thing` and `import pkg` name pkg (a parent package that Python imports on
    its own is no edge; naming it, as `import fuzzattn` does, is one)."""
    modules = {module_name(p, root): p for p in paths}
    graph = {}
    for name, path in modules.items():
        own = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = own.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                edges |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                          for a in node.names}
        graph[name] = {m for m in edges if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each as a sorted list."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_anywhere_in_the_package():
    assert cycles(import_graph(PACKAGE)) == []


def subpackage_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph seen a subpackage at a time (fuzzattn.judging.judge -> fuzzattn.judging):
    two subpackages leaning on each other through different modules make a cycle here even
    where no module does. The root (the public API, importing every layer) is left out."""
    def part(module: str) -> str | None:
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 else None

    collapsed: dict[str, set[str]] = {}
    for module, edges in graph.items():
        if (own := part(module)) is not None:
            collapsed.setdefault(own, set()).update(
                p for m in edges if (p := part(m)) is not None and p != own)
    return collapsed


def test_no_two_subpackages_import_each_other():
    assert cycles(subpackage_graph(import_graph(PACKAGE))) == []


def test_the_subpackage_check_finds_layers_leaning_on_each_other(tmp_path):
    """The case the layers once allowed by a special rank: an orchestrator inside `judging` runs
    an implementation through `run`, whose runs import `judging`'s verdicts; no module cycle."""
    for name, text in {"__init__.py": "", "judging/__init__.py": "", "run/__init__.py": "",
                       "judging/verdict.py": "",
                       "judging/judge.py": "def judge():\n    from fuzzattn.run.runs import run\n",
                       "run/runs.py": "from fuzzattn.judging.verdict import Verdict\n"}.items():
        (tmp_path / "fuzzattn" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fuzzattn" / name).write_text(text)
    graph = import_graph(sorted((tmp_path / "fuzzattn").rglob("*.py")), tmp_path)
    assert cycles(graph) == []
    assert cycles(subpackage_graph(graph)) == [["fuzzattn.judging", "fuzzattn.run"]]


def test_the_cycle_check_finds_a_cycle_through_the_package_root(tmp_path):
    """The probe: a module reading the version from `fuzzattn` closes a loop through the root."""
    (tmp_path / "fuzzattn" / "platform").mkdir(parents=True)
    (tmp_path / "fuzzattn" / "judgement").mkdir()
    (tmp_path / "fuzzattn" / "__init__.py").write_text("from fuzzattn.judgement.judge import judge\n")
    (tmp_path / "fuzzattn" / "platform" / "__init__.py").write_text("")
    (tmp_path / "fuzzattn" / "judgement" / "__init__.py").write_text("")
    (tmp_path / "fuzzattn" / "judgement" / "judge.py").write_text(
        "def judge():\n    from ..platform.versions import versions\n")
    (tmp_path / "fuzzattn" / "platform" / "versions.py").write_text(
        "def versions():\n    import fuzzattn\n    return fuzzattn.__version__\n")
    paths = sorted((tmp_path / "fuzzattn").rglob("*.py"))
    assert cycles(import_graph(paths, tmp_path)) == [
        ["fuzzattn", "fuzzattn.judgement.judge", "fuzzattn.platform.versions"]]
    (tmp_path / "fuzzattn" / "platform" / "versions.py").write_text("def versions():\n    pass\n")
    assert cycles(import_graph(paths, tmp_path)) == []


def test_the_cycle_check_finds_two_modules_importing_each_other(tmp_path):
    (tmp_path / "fuzzattn" / "triton_interpreter").mkdir(parents=True)
    (tmp_path / "fuzzattn" / "__init__.py").write_text("")
    (tmp_path / "fuzzattn" / "triton_interpreter" / "__init__.py").write_text("")
    (tmp_path / "fuzzattn" / "triton_interpreter" / "speed.py").write_text("from . import semantic\n")
    (tmp_path / "fuzzattn" / "triton_interpreter" / "semantic.py").write_text(
        "def f():\n    from fuzzattn.triton_interpreter.speed import g\n")
    paths = sorted((tmp_path / "fuzzattn").rglob("*.py"))
    assert cycles(import_graph(paths, tmp_path)) == [
        ["fuzzattn.triton_interpreter.semantic", "fuzzattn.triton_interpreter.speed"]]


@pytest.mark.parametrize("path", LAYERED, ids=_id)
def test_a_layer_imports_only_layers_below_it(path):
    own = rank(module_name(path))
    assert own is not None, f"{_id(path)} is in no layer: add it to LAYERS"
    upward = [(line, m) for line, m in imports(path) if (r := rank(m)) is not None and r > own]
    assert not upward, f"{_id(path)} imports a higher layer: {upward}"


@pytest.mark.parametrize("path", [p for p in LAYERED if module_name(p).split(".")[1] in ENGINE],
                         ids=_id)
def test_the_engine_never_imports_kernels_or_strategies(path):
    bad = [(line, m) for line, m in imports(path)
           if m.startswith(("fuzzattn.kernels", "fuzzattn.strategies"))]
    assert not bad, f"{_id(path)} imports {bad}: implementations come from the registry"


@pytest.mark.parametrize("path", sources("strategies"), ids=_id)
def test_strategies_depend_only_on_the_contract(path):
    bad = [(line, m) for line, m in imports(path) if m.startswith("fuzzattn")
           and not m.startswith(("fuzzattn.contract", "fuzzattn.strategies"))]
    assert not bad, f"{_id(path)} imports {bad}"


@pytest.mark.parametrize("path", sources("kernels"), ids=_id)
def test_no_implementation_imports_the_oracle(path):
    bad = [(line, m) for line, m in imports(path)
           if m.startswith(("fuzzattn.judging", "fuzzattn.judgement", "fuzzattn.gradients.reference_gradients"))]
    assert not bad, f"{_id(path)} imports the oracle it is judged by: {bad}"


def test_the_checker_sees_function_local_and_relative_imports(tmp_path):
    """The rules must not be fooled by an import hidden inside a function, or a relative one."""
    fake = tmp_path / "fuzzattn" / "judging" / "probe.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def f():\n    from fuzzattn.cli import main\n"
                    "    from ..campaigns import file_replay\n    from . import oracle\n")
    found = imports(fake, root=tmp_path)
    assert [(line, m) for line, m in found if (rank(m) or 0) > LAYERS["judgement"]] == [
        (2, "fuzzattn.cli"), (2, "fuzzattn.cli.main"), (3, "fuzzattn.campaigns"),
        (3, "fuzzattn.campaigns.file_replay")]
    assert (4, "fuzzattn.judging.oracle") in found


def test_every_engine_subpackage_says_what_it_is_for():
    for name in ENGINE:
        doc = ast.get_docstring(ast.parse((ROOT / "fuzzattn" / name / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 8, f"fuzzattn/{name}/__init__.py needs a docstring"


@pytest.mark.parametrize("path", PACKAGE, ids=_id)
def test_no_module_is_over_400_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= 400, f"{_id(path)} has {lines} lines: split it by concept"


def long_functions(path: Path) -> list[str]:
    """Functions over LONGEST_FUNCTION lines (decorators left out) whose docstring states no
    reason: no line of it starts with "Long because"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            doc = ast.get_docstring(node) or ""
            reason = any(line.strip().startswith("Long because") for line in doc.splitlines())
            if lines > LONGEST_FUNCTION and not reason:
                found.append(f"{node.name} ({lines} lines, line {node.lineno})")
    return found


@pytest.mark.parametrize("path", sources("fuzzattn"), ids=_id)
def test_no_function_is_over_80_lines_without_a_reason(path):
    long = long_functions(path)
    assert not long, (f"{_id(path)}: {', '.join(long)}: split it into named steps, or say why "
                      f"not in a docstring line starting 'Long because'")


def test_the_length_check_finds_a_long_function_and_accepts_a_stated_reason(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(LONGEST_FUNCTION))
    probe = tmp_path / "probe.py"
    probe.write_text(f"def short():\n    pass\n\n\ndef steps():\n{body}")
    assert long_functions(probe) == [f"steps ({LONGEST_FUNCTION + 1} lines, line 5)"]
    probe.write_text(f'def steps():\n    """One pass.\n\n    Long because the loop is one.\n'
                     f'    """\n{body}')
    assert long_functions(probe) == []


# Hypothesis's private parts: its internal modules (hypothesis.control's public names are
# re-exported by hypothesis itself), and the attributes it keeps on a test and on settings.
HYPOTHESIS_PRIVATE_MODULES = ("hypothesis.internal", "hypothesis.control", "hypothesis._")
HYPOTHESIS_PRIVATE_NAMES = ("_hypothesis_", "_current_profile")
HYPOTHESIS_ADAPTER = ROOT / "fuzzattn" / "campaigns" / "hypothesis_internals.py"


def hypothesis_private_uses(path: Path) -> list[str]:
    """Imports of Hypothesis's private modules, and private names, a file uses."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"line {node.lineno}: {m}" for m in modules if m.startswith(HYPOTHESIS_PRIVATE_MODULES)]
        elif isinstance(node, (ast.Attribute, ast.Constant)):
            name = node.attr if isinstance(node, ast.Attribute) else node.value
            if isinstance(name, str) and name.startswith(HYPOTHESIS_PRIVATE_NAMES):
                found.append(f"line {node.lineno}: {name}")
    return found


@pytest.mark.parametrize("path", [p for p in PACKAGE if p != HYPOTHESIS_ADAPTER], ids=_id)
def test_hypothesis_internals_are_used_only_through_the_fenced_adapter(path):
    assert not hypothesis_private_uses(path), (
        f"{_id(path)} uses Hypothesis's private parts {hypothesis_private_uses(path)}: "
        f"go through fuzzattn/campaigns/hypothesis_internals.py, fenced by version")


def test_the_adapter_check_finds_private_imports_and_attributes(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from hypothesis.control import current_build_context\n"
                     "import hypothesis.internal.scrutineer\nfrom hypothesis import given\n"
                     "def f(test, settings):\n    test._hypothesis_internal_use_seed = 1\n"
                     "    return getattr(settings, '_current_profile')\n")
    assert hypothesis_private_uses(probe) == [
        "line 1: hypothesis.control", "line 2: hypothesis.internal.scrutineer",
        "line 5: _hypothesis_internal_use_seed", "line 6: _current_profile"]
    assert hypothesis_private_uses(HYPOTHESIS_ADAPTER)           # where they all are
