"""Fixtures for the interop suite: a factory for Java KCL daemons (one JVM at a time, always
stopped), skipped with a clear reason where Java or the kclpy-ext wheel is missing."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kclasync.testing.emulators import LocalAws
from tests.interop.java_kcl import JavaKcl, java_executable, kcl_jars


@pytest.fixture
def java_kcl(kinesis: LocalAws, tmp_path: pathlib.Path) -> Iterator[Callable[..., JavaKcl]]:
    if java_executable() is None:
        pytest.skip("java is not installed (the interop suite needs Java 17)")
    if kcl_jars() is None:
        pytest.skip("the kclpy-ext wheel (dev dependency) is not installed")
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
        )
        started.append(daemon)
        return daemon

    try:
        yield make
    finally:
        for daemon in started:
            daemon.stop(kill=True)
