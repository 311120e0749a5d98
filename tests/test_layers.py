"""The import graph of ``kclasync``: no circle, and no import upward across the floors.

Every module under ``kclasync/`` is parsed with ``ast``; every import counts, also one under
``if TYPE_CHECKING:`` or inside a function (a circle hidden that way is still a circle for the
reader, and one refactoring away from a real one). Importing ``a.b.c`` runs ``a/__init__`` and
``a/b/__init__`` too; those implicit imports are not counted, only what a module names.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "kclasync"

#: The floors, bottom first: a module may import from its own floor and the floors below.
#: A module belongs to the floor of the longest prefix that names it.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("kclasync.errors", "kclasync._records", "kclasync.logging")),
    ("core", ("kclasync._core",)),
    ("adapters", ("kclasync._adapters",)),
    (
        "settings",
        (
            "kclasync._config",
            "kclasync._config_fields",
            "kclasync._config_checks",
            "kclasync._processor",
        ),
    ),
    ("runtime", ("kclasync._runtime",)),
    ("facade", ("kclasync._consumer", "kclasync._batches")),
    (
        "tools",
        (
            "kclasync",  # the package's public surface, ``kclasync/__init__.py``
            "kclasync.testing",
            "kclasync.integrations",
            "kclasync.dashboard",
            "kclasync.spark",
            "kclasync._simulation",
            "kclasync._cli",
            "kclasync._cli_errors",
            "kclasync._demo",
            "kclasync._lease_view",
            "kclasync._worker_view",
        ),
    ),
)


def module_names(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under ``root``."""
    names: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module ``name`` lives in (``a.b.Thing`` -> ``a.b``), or None outside the package."""
    while name not in modules:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The package's modules ``module`` imports, anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            # ``from pkg import sub`` imports the submodule; ``from mod import Name`` the module.
            names = [f"{source}.{alias.name}" for alias in node.names]
        for name in names:
            target = _resolve(name, modules)
            if target is not None and target != module:
                found.add(target)
    return found


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def floor_of(module: str, floors: Iterable[tuple[str, tuple[str, ...]]] = FLOORS) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, floor)
    for number, (_, prefixes) in enumerate(floors):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), number)
    return None if best is None else best[1]


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def upward(graph: Mapping[str, set[str]]) -> list[str]:
    """Every import of a module on a higher floor, as ``a (floor) -> b (floor)``."""
    found = []
    for module, targets in sorted(graph.items()):
        here = floor_of(module)
        for target in sorted(targets):
            there = floor_of(target)
            if here is not None and there is not None and there > here:
                found.append(f"{module} ({FLOORS[here][0]}) -> {target} ({FLOORS[there][0]})")
    return found


# -- the package ----------------------------------------------------------------------------


def test_every_module_is_on_a_floor() -> None:
    unplaced = sorted(m for m in module_names() if floor_of(m) is None)
    assert not unplaced, f"put these modules on a floor in FLOORS: {unplaced}"


def test_no_import_circle() -> None:
    found = cycles(import_graph(module_names()))
    assert not found, f"import circles: {found}"


def test_no_import_upward() -> None:
    found = upward(import_graph(module_names()))
    assert not found, "imports upward across the floors:\n" + "\n".join(found)


def test_no_helper_of_the_lease_path_imports_the_coordinator() -> None:
    graph = import_graph(module_names())
    helpers = ("held", "lease_taking", "lease_renewals", "lease_handoffs")
    importers = [
        h
        for h in helpers
        if "kclasync._runtime.lease_coordinator" in graph[f"kclasync._runtime.{h}"]
    ]
    assert not importers


# -- the checker itself ---------------------------------------------------------------------


def _write(root: Path, files: Mapping[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return module_names(root / "kclasync")


def test_the_checker_sees_circles_hidden_under_type_checking_and_in_functions(
    tmp_path: Path,
) -> None:
    modules = _write(
        tmp_path,
        {
            "kclasync/__init__.py": "",
            "kclasync/_runtime/__init__.py": "",
            "kclasync/_runtime/a.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from kclasync._runtime.b import B\n"
            ),
            "kclasync/_runtime/b.py": "def f():\n    from . import c\n",
            "kclasync/_runtime/c.py": "import kclasync._runtime.a\n",
        },
    )
    graph = import_graph(modules)
    assert graph["kclasync._runtime.b"] == {"kclasync._runtime.c"}
    assert cycles(graph) == [["kclasync._runtime.a", "kclasync._runtime.b", "kclasync._runtime.c"]]


def test_the_checker_sees_an_import_upward(tmp_path: Path) -> None:
    modules = _write(
        tmp_path,
        {
            "kclasync/__init__.py": "",
            "kclasync/_core/__init__.py": "",
            "kclasync/_core/rules.py": "from kclasync._runtime.loop import Loop\n",
            "kclasync/_runtime/__init__.py": "",
            "kclasync/_runtime/loop.py": "from kclasync._core import rules\n",
        },
    )
    graph = import_graph(modules)
    assert upward(graph) == ["kclasync._core.rules (core) -> kclasync._runtime.loop (runtime)"]
    assert cycles(graph) == [["kclasync._core.rules", "kclasync._runtime.loop"]]
