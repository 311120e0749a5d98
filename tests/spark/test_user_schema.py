"""A user schema (``.schema(SCHEMA_DDL)``) changes nothing: options, stream and progress table
are checked at ``load()``, and LATEST is pinned at ``load()``, with a producer writing during
``load()`` and ``start()``. And an AvailableNow run plans no empty trailing batch."""

from __future__ import annotations

import pathlib
import threading
from typing import Any

from kclasync.spark import SCHEMA_DDL
from kclasync.testing.emulators import LocalAws
from tests.spark.support import create_and_produce, produce, source_options
from tests.spark.test_source import id_column


def test_latest_is_pinned_at_load_with_a_user_schema(
    spark: Any, moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    before = create_and_produce(moto, unique_name, 2, 50)
    opts = source_options(moto, unique_name, tmp_path, startingPosition="LATEST")
    df = spark.readStream.format("kinesis").schema(SCHEMA_DDL).options(**opts).load()
    # A producer writes while the query starts and runs its first planning.
    written: list[int] = []
    producing = threading.Thread(
        target=lambda: written.extend(produce(moto, unique_name, 1000, 200)), daemon=True
    )
    producing.start()
    query = (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        producing.join(120)
        assert not producing.is_alive()
        out = str(tmp_path / "out")

        def read_ids() -> list[int]:
            try:
                return [r[0] for r in spark.read.parquet(out).select(id_column()).collect()]
            except Exception:  # no file yet
                return []

        import time

        deadline = time.monotonic() + 120
        got = read_ids()
        while len(got) < len(written) and time.monotonic() < deadline:
            query.processAllAvailable()
            got = read_ids()
    finally:
        query.stop()
    assert query.exception() is None
    assert sorted(got) == written  # every record put after load(), none twice
    assert not set(got) & set(before)


def test_available_now_plans_no_empty_trailing_batch(
    spark: Any, moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    # One shard, 100 records, 50 per batch: the second batch ends exactly at its quota.
    ids = create_and_produce(moto, unique_name, 1, 100)
    opts = source_options(moto, unique_name, tmp_path, maxRecordsPerShard=50)
    df = spark.readStream.format("kinesis").options(**opts).load()
    query = (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None
    assert spark.read.parquet(str(tmp_path / "out")).count() == len(ids)
    sizes = [p["numInputRows"] for p in query.recentProgress]
    assert sizes and all(sizes), f"an empty batch was planned: {sizes}"
    assert sizes == [50, 50]
