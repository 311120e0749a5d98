"""The ``kinesis`` streaming source against moto's server: exact row counts, read limits,
Trigger.AvailableNow, and a restart after a failed batch with no loss and no duplicates."""

from __future__ import annotations

import contextlib
import pathlib
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from kclasync.spark import COLUMNS
from kclasync.testing.emulators import LocalAws
from tests.spark.support import create_and_produce, produce, source_options


def id_column() -> Any:
    return F.get_json_object(F.col("data").cast("string"), "$.id").cast("long")


def run_available_now(
    spark: Any, options: dict[str, str], out: pathlib.Path, ck: pathlib.Path, transform: Any = None
) -> Any:
    df = spark.readStream.format("kinesis").options(**options).load()
    if transform is not None:
        df = transform(df)
    query = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    with contextlib.suppress(StreamingQueryException):
        assert query.awaitTermination(120), "the query did not finish in 120 s"
    return query


def test_reads_every_record_once_within_limits(
    spark: Any, moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    ids = create_and_produce(moto, unique_name, 4, 1200)
    opts = source_options(moto, unique_name, tmp_path, maxRecordsPerShard=100)
    query = run_available_now(spark, opts, tmp_path / "out", tmp_path / "ck")
    assert query.exception() is None
    rows = spark.read.parquet(str(tmp_path / "out"))
    assert tuple(rows.columns) == COLUMNS
    assert rows.count() == len(ids)
    assert {r[0] for r in rows.select(id_column()).collect()} == set(ids)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert max(sizes) <= 4 * 100
    assert sum(sizes) == len(ids)
    assert len(sizes) >= 3


def test_restart_after_failed_batch_loses_and_duplicates_nothing(
    spark: Any, moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    ids = create_and_produce(moto, unique_name, 2, 600)
    opts = source_options(moto, unique_name, tmp_path, maxRecordsPerShard=100)
    out, ck = tmp_path / "out", tmp_path / "ck"

    # The batch holding record 550 fails after its shards were read and their ranges recorded.
    def failing(df: Any) -> Any:
        return df.where(
            F.when(id_column() == 550, F.raise_error(F.lit("injected"))).otherwise(F.lit(True))
        )

    first = run_available_now(spark, opts, out, ck, failing)
    assert first.exception() is not None and "injected" in str(first.exception())
    committed = spark.read.parquet(str(out)).count()
    assert 0 < committed < len(ids)
    failed_batch = max(p["batchId"] for p in first.recentProgress) + 1

    more = produce(moto, unique_name, 600, 200)
    second = run_available_now(spark, opts, out, ck)
    assert second.exception() is None
    assert min(p["batchId"] for p in second.recentProgress) == failed_batch
    got = [r[0] for r in spark.read.parquet(str(out)).select(id_column()).collect()]
    assert len(got) == len(ids) + len(more)
    assert set(got) == set(ids) | set(more)


def test_latest_is_pinned_when_load_defines_the_dataframe(
    spark: Any, moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    before = create_and_produce(moto, unique_name, 2, 100)
    opts = source_options(moto, unique_name, tmp_path, startingPosition="LATEST")
    df = spark.readStream.format("kinesis").options(**opts).load()
    # Written after load() and before start(): read, not skipped.
    after = produce(moto, unique_name, 100, 150)
    query = (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None
    got = [r[0] for r in spark.read.parquet(str(tmp_path / "out")).select(id_column()).collect()]
    assert sorted(got) == after
    assert not set(got) & set(before)
