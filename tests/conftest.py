"""Shared fixtures: one moto server process per test session, on 127.0.0.1, and kinesis-local
(Kinesis only; DynamoDB stays on moto) for the tests that reshard.

The suite runs on pytest-xdist workers (``addopts``): each worker is a session of its own, with
its own moto and kinesis-local on free ports. The tests that start a JVM (Spark, the Java KCL)
are one unit of work (``JvmChain``), so ``--dist loadgroup`` runs them one after another on one
worker: never two JVMs at once."""

from __future__ import annotations

import contextlib
import fcntl
import pathlib
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kclasync.testing.emulators import LocalAws, find_kinesis_local, kinesis_local, moto_process

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: Test folders whose tests start a JVM: never more than one of them at a time.
JVM_FOLDERS = ("spark", "interop")
#: Modules in ``JVM_FOLDERS`` that start no JVM (the Spark package's parts driven directly, with
#: no Spark session): they run beside the JVM chain, not in it (tests/test_suite_split.py checks
#: that they name no JVM).
JVM_FREE_MODULES = frozenset(
    f"tests/spark/test_{name}.py"
    for name in (
        "arrow_rows",
        "batch_calls",
        "driver_open",
        "early_iterators",
        "fanout_pages",
        "fanout_tasks",
        "fetch",
        "first_planning",
        "group_handover",
        "offsets",
        "planning",
        "probe_iterator",
        "progress",
        "staging",
        "worker_io",
    )
)
#: Test folders with the longest tests that are not JVM tests: scheduled right after them.
EARLY_FOLDERS = ("simulation",)


def _jvm_scope(nodeid: str) -> str | None:
    """``"jvm"`` for a test in one of ``JVM_FOLDERS`` (by its node id) outside
    ``JVM_FREE_MODULES``, else None."""
    module = nodeid.split("::", 1)[0]
    parts = module.split("/")
    in_folder = len(parts) > 2 and parts[0] == "tests" and parts[1] in JVM_FOLDERS
    return "jvm" if in_folder and module not in JVM_FREE_MODULES else None


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: the JVM tests are one unit of work, every other test is one of its
    own. (xdist's own grouping renames ``item._nodeid``, which pytest 9 no longer reads for the
    node id, so its ``xdist_group`` marks alone would spread the JVM tests over the workers.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class JvmChain(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _jvm_scope(nodeid) or nodeid

    return JvmChain(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The JVM tests are marked (``xdist_group``) and come first: they are the longest share
    of the suite on one worker, so they start while the other worker takes the rest (xdist
    sends the largest unit first). The simulation's long CPU-bound runs (sweeps, soak) come
    next, so they do not end last."""
    tests = ROOT / "tests"
    jvm: list[pytest.Item] = []
    early: list[pytest.Item] = []
    rest: list[pytest.Item] = []
    for item in items:
        parts = item.path.relative_to(tests).parts if item.path.is_relative_to(tests) else ()
        if _jvm_scope(item.nodeid) is not None:
            item.add_marker(pytest.mark.xdist_group("jvm"))
            jvm.append(item)
        elif parts and parts[0] in EARLY_FOLDERS:
            early.append(item)
        else:
            rest.append(item)
    items[:] = jvm + early + rest


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (xdist workers setting up the same thing wait in turn)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def moto() -> Iterator[LocalAws]:
    with moto_process() as aws:
        yield aws


@pytest.fixture(scope="session")
def kinesis(moto: LocalAws) -> Iterator[LocalAws]:
    """kinesis-local for Kinesis and the session's moto for DynamoDB. Installs the npm package
    from package-lock.json first when ``npm ci`` has not been run yet."""
    script = find_kinesis_local(str(ROOT))
    if script is None:
        with _locked(pathlib.Path(tempfile.gettempdir()) / "kclasync-npm-ci.lock"):
            script = find_kinesis_local(str(ROOT))  # another worker may have installed it
            if script is None:
                npm = shutil.which("npm")
                assert npm is not None, "npm is needed to install kinesis-local (see package.json)"
                subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=ROOT, check=True)
                script = find_kinesis_local(str(ROOT))
    assert script is not None, "npm ci did not install kinesis-local"
    with kinesis_local(moto, script=script) as aws:
        yield aws


@pytest.fixture
def unique_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"
