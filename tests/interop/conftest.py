"""Fixtures for the interop suite: a factory for Java KCL daemons (one JVM at a time, always
stopped), skipped with a clear reason where Java or the kclpy-ext wheel is missing, and the class
data sharing archive their starts map (made once, kept in pytest's cache directory)."""

from __future__ import annotations

import fcntl
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kclasync.testing.emulators import LocalAws
from tests.interop.java_kcl import (
    JavaKcl,
    class_archive_name,
    java_executable,
    kcl_jars,
    make_class_archive,
)


def _has_java() -> None:
    if java_executable() is None:
        pytest.skip("java is not installed (the interop suite needs Java 17)")
    if kcl_jars() is None:
        pytest.skip("the kclpy-ext wheel (dev dependency) is not installed")


@pytest.fixture(scope="session")
def kcl_class_archive(
    kinesis: LocalAws, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> pathlib.Path | None:
    """The daemons' class data sharing archive: made by one short daemon run the first time
    (``java_kcl.make_class_archive``), then kept in pytest's cache directory (a session's
    temporary directory where the cache is off). None if it could not be made."""
    _has_java()
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("kcl-class-archive") if cache is not None else None
    folder = pathlib.Path(folder) if folder is not None else tmp_path_factory.mktemp("cds")
    target = folder / class_archive_name()
    with (folder / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process making it: wait for its archive
        if not target.exists():
            make_class_archive(kinesis, tmp_path_factory.mktemp("cds-run"), target)
    return target if target.exists() else None


@pytest.fixture
def java_kcl(
    kinesis: LocalAws, tmp_path: pathlib.Path, kcl_class_archive: pathlib.Path | None
) -> Iterator[Callable[..., JavaKcl]]:
    _has_java()
    shared = () if kcl_class_archive is None else (f"-XX:SharedArchiveFile={kcl_class_archive}",)
    started: list[JavaKcl] = []

    def make(*, stream: str, application: str, worker_id: str, **props: Any) -> JavaKcl:
        assert not any(j.running for j in started), "one JVM at a time"
        daemon = JavaKcl(
            kinesis,
            stream=stream,
            application=application,
            worker_id=worker_id,
            workdir=tmp_path,
            properties={k: str(v) for k, v in props.items()},
            jvm_options=shared,
        )
        started.append(daemon)
        return daemon

    try:
        yield make
    finally:
        for daemon in started:
            daemon.stop(kill=True)
