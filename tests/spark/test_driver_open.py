"""The reader's driver clients: in Spark's streaming source runner they are opened on a thread
as soon as Spark makes the reader (not in the query's first planning), elsewhere at their first
use; either way the planning reads the same, and ``stop`` closes them. The initial offset is
made once per reader (moto's server)."""

from __future__ import annotations

import pathlib

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

import kclasync.spark.data_source as data_source_module
from kclasync.spark.data_source import KinesisDataSource
from kclasync.spark.driver_io import in_source_runner
from kclasync.spark.source import KinesisStreamReader
from kclasync.testing.emulators import LocalAws
from tests.spark.support import create_and_produce, source_options


def _reader(local: LocalAws, stream: str, tmp: pathlib.Path) -> KinesisStreamReader:
    source = KinesisDataSource(source_options(local, stream, tmp, metadataPath=str(tmp / "m")))
    return source.streamReader(None)


def test_outside_the_runner_the_clients_open_at_first_use(
    moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    assert not in_source_runner()  # pytest is not Spark's source runner
    create_and_produce(moto, unique_name, 2, 10)
    reader = _reader(moto, unique_name, tmp_path)
    try:
        assert reader._clients._opening is None and reader._clients._io is None
        start = reader.initialOffset()
        kinesis = reader._clients._io.kinesis if reader._clients._io else None
        assert kinesis is not None
        listed = kinesis.calls["list_shards"]
        # Spark asks again as the query starts: the same offset (the same run), no new listing.
        assert reader.initialOffset() == start
        assert kinesis.calls["list_shards"] == listed
        assert reader.latestOffset(start, ReadAllAvailable()) != start
    finally:
        reader.stop()
    assert reader._clients._io is None


def test_in_the_runner_the_clients_open_on_a_thread_and_are_used_and_closed(
    moto: LocalAws, unique_name: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_and_produce(moto, unique_name, 2, 10)
    monkeypatch.setattr(data_source_module, "in_source_runner", lambda: True)
    reader = _reader(moto, unique_name, tmp_path)
    try:
        opening = reader._clients._opening
        assert opening is not None
        early = opening.result(timeout=60)
        start = reader.initialOffset()
        assert reader._clients._io is early  # the planning uses the clients opened early
        assert reader.latestOffset(start, ReadAllAvailable()) != start
    finally:
        reader.stop()
    assert reader._clients._io is None and reader._clients._opening is None

    # A reader stopped before its first planning closes the clients it opened early.
    unused = _reader(moto, unique_name, tmp_path)
    assert unused._clients._opening is not None
    unused.stop()
    assert unused._clients._opening is None and unused._clients._io is None
