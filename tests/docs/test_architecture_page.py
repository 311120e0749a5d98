"""docs/architecture.md names every module of ``kclasync``, and only modules that exist.

The rule. Paths on the page are written relative to ``kclasync/`` (a leading ``kclasync/`` is
allowed). In the page's two map sections, "## Floors" and "## Where each decision is made":

* a module ``a/b.py`` is named when its path appears, e.g. ``_runtime/worker.py``;
* a package named as a unit, written ``pkg/*`` (e.g. ``spark/*``), names every module under it,
  its ``__init__.py`` included;
* a package's ``__init__.py`` is also named when the package's path appears with its trailing
  slash, e.g. ``_core/`` (the top-level ``__init__.py`` is named as ``__init__.py``).

Every ``.py`` file under ``kclasync/`` must be named so. And anywhere on the page, every ``.py``
path that is not a repository path (``tests/``, ``benchmarks/``, ``docs/``, ``examples/``) and
every ``pkg/*`` must exist under ``kclasync/``, so a renamed or removed module fails here too.
A path counts only whole: ``_cli_errors.py`` does not name ``errors.py``, and
``_simulation/worker.py`` does not name ``_runtime/worker.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kclasync"
PAGE = ROOT / "docs" / "architecture.md"
MAP_SECTIONS = ("## Floors", "## Where each decision is made")
REPOSITORY_PATHS = ("tests/", "benchmarks/", "docs/", "examples/")

_START = r"(?<![\w./*-])(?:kclasync/)?"
MODULE = re.compile(_START + r"((?:\w+/)*\w+\.py)(?![\w/])")
UNIT = re.compile(_START + r"((?:\w+/)+)\*")
PACKAGE_DIR = re.compile(_START + r"((?:\w+/)+)(?![\w*/])")


def modules(root: Path = PACKAGE) -> set[str]:
    """Every ``.py`` file under ``root``, as its path relative to ``root``."""
    return {path.relative_to(root).as_posix() for path in root.rglob("*.py")}


def map_text(page: str) -> str:
    """The text of the page's map sections (each from its heading to the next ``## ``)."""
    parts = []
    for heading in MAP_SECTIONS:
        start = page.find(heading + "\n")
        assert start >= 0, f"the page has no section {heading!r}"
        end = page.find("\n## ", start + len(heading))
        parts.append(page[start : None if end < 0 else end])
    return "\n".join(parts)


def unnamed(page: str, files: set[str]) -> list[str]:
    """The modules of ``files`` the page's map sections do not name (see the rule above)."""
    text = map_text(page)
    named = set(MODULE.findall(text))
    units = set(UNIT.findall(text))
    packages = {"" if p == "kclasync/" else p for p in PACKAGE_DIR.findall(text)}
    missing = []
    for module in sorted(files):
        if module in named or any(module.startswith(unit) for unit in units):
            continue
        if module.endswith("__init__.py") and module.removesuffix("__init__.py") in packages:
            continue
        missing.append(module)
    return missing


def nonexistent(page: str, files: set[str]) -> list[str]:
    """The ``kclasync`` paths (modules and ``pkg/*`` units) the page names that do not exist."""
    found = []
    for path in MODULE.findall(page):
        if not path.startswith(REPOSITORY_PATHS) and path not in files:
            found.append(path)
    for unit in UNIT.findall(page):
        if f"{unit}__init__.py" not in files:
            found.append(unit + "*")
    return sorted(set(found))


# -- the page ---------------------------------------------------------------------------------


def test_every_module_is_on_the_floor_list_or_in_the_decision_table() -> None:
    missing = unnamed(PAGE.read_text(), modules())
    assert not missing, f"name these modules in docs/architecture.md: {missing}"


def test_every_module_the_page_names_exists() -> None:
    stale = nonexistent(PAGE.read_text(), modules())
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"


def test_the_page_stays_short() -> None:
    assert len(PAGE.read_text().splitlines()) <= 200


# -- the checker itself -----------------------------------------------------------------------

_FILES = {
    "__init__.py",
    "errors.py",
    "_cli_errors.py",
    "_core/__init__.py",
    "_core/leases/lease.py",
    "_runtime/worker.py",
    "_simulation/__init__.py",
    "_simulation/worker.py",
}


def _page(floors: str, decisions: str = "", rest: str = "") -> str:
    return (
        f"# A\n\n## Floors\n\n{floors}\n\n## Where each decision is made\n\n{decisions}\n\n"
        f"## Other\n\n{rest}\n"
    )


def test_the_checker_accepts_a_complete_page() -> None:
    page = _page(
        "`__init__.py`, `kclasync/errors.py`, `_cli_errors.py`, `_core/`, `_simulation/*`",
        "| lease | `_core/leases/lease.py` | `_runtime/worker.py` |",
    )
    assert unnamed(page, _FILES) == []
    assert nonexistent(page, _FILES) == []


def test_the_checker_sees_a_missing_module_and_counts_paths_only_whole() -> None:
    page = _page(
        "`_cli_errors.py`, `_core/leases/lease.py`, `_simulation/worker.py`",
        rest="`__init__.py`, `_runtime/worker.py`, `_simulation/*`, `_core/`",
    )
    assert unnamed(page, _FILES) == [
        "__init__.py",  # named outside the map sections only
        "_core/__init__.py",
        "_runtime/worker.py",
        "_simulation/__init__.py",
        "errors.py",
    ]


def test_the_checker_sees_a_path_that_does_not_exist() -> None:
    page = _page(
        "`_core/leases/lease.py`",
        rest="`kclasync/_core/gone.py`, `spark/*`, `tests/test_layers.py`, `docs/x.py`",
    )
    assert nonexistent(page, _FILES) == ["_core/gone.py", "spark/*"]
