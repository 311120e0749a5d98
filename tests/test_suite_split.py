"""How the suite is split over pytest-xdist workers (tests/conftest.py): every test that can
start a JVM belongs to the one unit of work that runs on a single worker, and nothing else does.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import pytest

from tests.conftest import (
    JVM_FOLDERS,
    JVM_FREE_MODULES,
    ROOT,
    _jvm_scope,
    pytest_xdist_make_scheduler,
)

#: What a test module names when it starts a JVM: the Java KCL's daemon, or a Spark session.
JVM_NAMES = {"java_kcl", "JavaKcl", "spark", "SparkSession"}


def test_node_ids_of_the_jvm_folders_are_one_scope() -> None:
    assert _jvm_scope("tests/interop/test_shared_tables.py::test_x") == "jvm"
    assert _jvm_scope("tests/spark/test_kpl.py::TestA::test_b[load]") == "jvm"
    assert _jvm_scope("tests/interop/test_x.py::test_y@jvm") == "jvm"
    assert _jvm_scope("tests/e2e/test_consumer.py::test_x") is None
    assert _jvm_scope("tests/test_layers.py::test_x") is None
    assert _jvm_scope("tests/e2e/interop.py::test_x") is None
    assert _jvm_scope("tests/spark/test_fetch.py::test_x") is None  # JVM-free


class _Config:
    def __init__(self, dist: str) -> None:
        self.dist = dist

    def getvalue(self, name: str) -> Any:
        return {"dist": self.dist, "tx": ["2*popen"]}.get(name)


def test_the_scheduler_groups_only_under_loadgroup() -> None:
    pytest.importorskip("xdist")
    assert pytest_xdist_make_scheduler(_Config("load"), None) is None  # type: ignore[arg-type]
    sched = pytest_xdist_make_scheduler(_Config("loadgroup"), None)  # type: ignore[arg-type]
    assert sched._split_scope("tests/spark/test_sink.py::test_a") == "jvm"
    assert sched._split_scope("tests/e2e/test_a.py::test_b") == "tests/e2e/test_a.py::test_b"
    free = "tests/spark/test_fetch.py::test_a"
    assert sched._split_scope(free) == free


def _names(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.ImportFrom):
            found.update(alias.name for alias in node.names)
    return found


def test_no_test_outside_the_jvm_folders_starts_a_jvm() -> None:
    tests = ROOT / "tests"
    outside = [
        str(path.relative_to(ROOT))
        for path in sorted(tests.rglob("test_*.py"))
        if path.relative_to(tests).parts[0] not in JVM_FOLDERS and _names(path) & JVM_NAMES
    ]
    assert not outside, f"JVM tests outside {JVM_FOLDERS}: {outside}"


def test_the_jvm_free_modules_exist_and_start_no_jvm() -> None:
    paths = [ROOT / module for module in sorted(JVM_FREE_MODULES)]
    assert all(path.is_file() for path in paths), [p for p in paths if not p.is_file()]
    starting = [str(p.relative_to(ROOT)) for p in paths if _names(p) & JVM_NAMES]
    assert not starting, f"listed as JVM-free but naming a JVM: {starting}"
