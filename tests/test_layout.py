"""The package's shape: imports among quickdraft modules never go round in a circle, not even for type checking;
modules stay small, and so does the README, a user's page."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import quickdraft

PACKAGE = Path(quickdraft.__file__).parent
README = PACKAGE.parent / "README.md"
MAX_MODULE_LINES = 400
MAX_README_LINES = 300


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package is its ``__init__``)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The quickdraft modules ``name`` imports anywhere in its file: deferred imports inside functions too, and
    ``if TYPE_CHECKING:`` blocks (a cycle for type checking is still two modules that need each other)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def owner(dotted: str) -> str | None:  # the module that defines ``dotted`` (a module, or a name in one)
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: set[str | None] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(owner(alias.name) for alias in node.names if alias.name.startswith("quickdraft"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.startswith("quickdraft"):
                found.update(owner(f"{source}.{alias.name}") for alias in node.names)
    return {module for module in found if module is not None and module != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A list of modules that import each other in a circle, or None (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for dependency in sorted(graph[module]):
            if state.get(dependency) == "open":
                return [*path[path.index(dependency) :], dependency]
            if dependency not in state and (cycle := visit(dependency)):
                return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_quickdraft_modules_import_each_other_in_no_circle() -> None:
    modules = module_files()
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    assert "quickdraft.api" in graph["quickdraft.cli.generate"]  # the graph sees real imports
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_package_exports_each_name_it_lists() -> None:
    """``__all__`` (literal, for type checkers) and the lazy exports (``EXPORTS``) name the same things, and each is
    the object its module defines."""
    assert set(quickdraft.__all__) == {*quickdraft.EXPORTS, "__version__"}
    for name, module in quickdraft.EXPORTS.items():
        assert getattr(quickdraft, name) is getattr(importlib.import_module(module), name)
    assert len(dir(quickdraft)) == len(set(dir(quickdraft)))


def test_the_cycle_finder_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_module_is_longer_than_a_reader_can_hold() -> None:
    lengths = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in module_files().items()}
    assert not {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES}


def test_the_readme_stays_a_users_page() -> None:
    if not README.exists():  # an installed package without its checkout
        pytest.skip("no README beside the package")
    assert len(README.read_text(encoding="utf-8").splitlines()) <= MAX_README_LINES
