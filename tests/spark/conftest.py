"""One Spark session (local[2]) for every Spark test: it costs 5-8 s and about 1 GB."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from kclasync.spark import register

    started = time.monotonic()
    session = (
        SparkSession.builder.master("local[2]")
        .appName("kclasync-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    sys.stderr.write(f"\nSpark session started in {time.monotonic() - started:.1f}s\n")
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _no_query_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """A query a failed test left running is stopped, so that it cannot fail the next tests."""
    yield
    if "spark" in request.fixturenames:
        for query in request.getfixturevalue("spark").streams.active:
            query.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The first Spark test also pays for the session's start (5-80 s on a busy machine).
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(400))
