"""The public surface: every exported name is documented, and nothing public leaks internals."""

from __future__ import annotations

import ast
import pathlib
import re

import kclasync

ROOT = pathlib.Path(__file__).resolve().parent.parent
API_DOC = ROOT / "docs" / "api.md"


def _documented_names() -> set[str]:
    return set(re.findall(r"^### `([A-Za-z_][A-Za-z0-9_]*)`", API_DOC.read_text(), re.MULTILINE))


def test_every_exported_name_has_a_docs_entry() -> None:
    missing = sorted(set(kclasync.__all__) - _documented_names())
    assert not missing, f"add a '### `Name`' section to docs/api.md for: {missing}"


def test_docs_entries_name_only_exported_names() -> None:
    stale = sorted(_documented_names() - set(kclasync.__all__))
    assert not stale, f"docs/api.md documents names kclasync does not export: {stale}"


def test_every_exported_name_is_importable() -> None:
    for name in kclasync.__all__:
        assert getattr(kclasync, name) is not None, name


def _imported_modules(path: pathlib.Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


def test_examples_import_only_public_modules() -> None:
    for path in sorted((ROOT / "examples").glob("*.py")):
        private = sorted(
            m for m in _imported_modules(path) if m.startswith("kclasync") and "._" in m
        )
        assert not private, f"{path.name} imports internal modules: {private}"


def test_internal_modules_are_underscored() -> None:
    public = {"errors", "integrations", "spark", "testing", "dashboard", "logging", "multilang"}
    package = ROOT / "kclasync"
    for entry in package.iterdir():
        name = entry.stem if entry.suffix == ".py" else entry.name
        if name.startswith(("_", ".")) or entry.suffix not in ("", ".py") or name == "py":
            continue
        assert name in public, f"kclasync.{name} is neither private (_{name}) nor a public module"
