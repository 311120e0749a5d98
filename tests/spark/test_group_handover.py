"""A task that reads several shards (``shardsPerTask``) hands each shard's rows to Spark as soon
as that shard is read and recorded, while the others are still being read; a failed read or a
closed iterator cancels the reads still running. Driven as an executor drives the source (moto's
server, no Spark session): one shard's read is held on an event until the test lets it go."""

from __future__ import annotations

import asyncio
import copy
import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

import kclasync.spark.shard_task as task_module
import kclasync.spark.worker_io as worker_module
from kclasync.spark.options import SourceOptions
from kclasync.spark.shard_task import ShardGroupPartition, arrow_batches
from kclasync.spark.source import KinesisStreamReader
from kclasync.spark.worker_io import WorkerIO
from kclasync.testing.emulators import LocalAws
from tests.spark.support import create_and_produce, source_options

WAIT = 30.0
HOLD = 10.0


def _ids(batch: Any) -> list[int]:
    return [orjson.loads(d)["id"] for d in batch.column("data").to_pylist()]


class Held:
    """Holds the read of the shard named ``shard`` until ``go`` is set (or fails it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_other: bool = False) -> None:
        self.shard: str | None = None
        self.go = threading.Event()
        self.cancelled = threading.Event()
        self.gave_up = threading.Event()  # held past HOLD: nothing else could go on
        self.fail_other = fail_other
        real = task_module.read_shard

        async def read(client: Any, stream: str, shard_id: str, *a: Any, **kw: Any) -> Any:
            if self.shard is None:
                self.shard = shard_id  # the first shard to start is held
            if shard_id == self.shard:
                deadline = asyncio.get_running_loop().time() + HOLD
                try:
                    while not self.go.is_set():
                        if asyncio.get_running_loop().time() > deadline:
                            self.gave_up.set()
                            break
                        await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    self.cancelled.set()
                    raise
            elif self.fail_other:
                raise RuntimeError(f"read of {shard_id} failed")
            return await real(client, stream, shard_id, *a, **kw)

        monkeypatch.setattr(task_module, "read_shard", read)


@pytest.fixture
def planned(
    moto: LocalAws, unique_name: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[list[int], ShardGroupPartition]]:
    """A 2-shard stream holding 60 records, and the one task (both shards) that reads its first
    batch; the task runs on this process's ``WorkerIO``, as on an executor."""
    io = WorkerIO()
    monkeypatch.setattr(worker_module, "_current", io)
    ids = create_and_produce(moto, unique_name, 2, 60)
    opts = SourceOptions.parse(
        source_options(
            moto, unique_name, tmp_path, metadataPath=str(tmp_path / "m"), shardsPerTask=2
        )
    )
    reader = KinesisStreamReader(opts)
    try:
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        end = reader.latestOffset(start, ReadAllAvailable())
        (group,) = reader.partitions(start, end)
        assert isinstance(group, ShardGroupPartition) and len(group.parts) == 2
        yield ids, group
    finally:
        reader.stop()
        io.close()


def test_a_read_shard_leaves_while_the_other_is_still_read(
    planned: tuple[list[int], ShardGroupPartition], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, group = planned
    held = Held(monkeypatch)
    batches = arrow_batches(group)
    first = next(batches)  # arrives although one shard's read is still held
    assert not held.gave_up.is_set() and held.shard is not None and first.num_rows > 0
    held.go.set()
    rows = _ids(first) + [i for batch in batches for i in _ids(batch)]
    assert sorted(rows) == ids
    # A replay of the task (Spark retrying it) hands over the same rows.
    again = [i for batch in arrow_batches(group) for i in _ids(batch)]
    assert sorted(again) == ids


def test_a_failed_read_cancels_the_shard_still_read(
    planned: tuple[list[int], ShardGroupPartition], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, group = planned
    held = Held(monkeypatch, fail_other=True)
    with pytest.raises(RuntimeError, match=r"read of .* failed"):
        list(arrow_batches(group))
    assert held.cancelled.wait(WAIT)
    assert not held.gave_up.is_set()  # cancelled, not let go by its own time limit


def test_closing_the_rows_cancels_the_reads(
    planned: tuple[list[int], ShardGroupPartition], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, group = planned
    held = Held(monkeypatch)
    batches = arrow_batches(group)
    assert next(batches).num_rows > 0
    batches.close()  # Spark stops the task (a limit reached, or the task killed)
    assert held.cancelled.wait(WAIT)


class CountingStore:
    """A progress store that counts the reads a task makes."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.reads: dict[str, int] = {"get": 0, "get_batch": 0}

    async def get(self, *args: Any) -> Any:
        self.reads["get"] += 1
        return await self.store.get(*args)

    async def get_batch(self, *args: Any) -> Any:
        self.reads["get_batch"] += 1
        return await self.store.get_batch(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_task_reads_its_shards_progress_once_and_replays_what_was_recorded(
    planned: tuple[list[int], ShardGroupPartition], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, group = planned
    io = worker_module.worker_io()
    real = io.progress
    counting: list[CountingStore] = []

    async def progress(*args: Any) -> CountingStore:
        if not counting:
            counting.append(CountingStore(await real(*args)))
        return counting[0]

    monkeypatch.setattr(io, "progress", progress)
    # An earlier attempt of this task recorded 5 records of the first shard (its quota was
    # smaller): this attempt must hand over exactly those 5 for it, and the whole second shard.
    earlier = copy.copy(group.parts[0])
    earlier.quota = 5
    recorded = task_module.read_partition(earlier)
    assert len(recorded) == 5
    counting[0].reads.update(get=0, get_batch=0)
    by_shard: dict[str, list[int]] = {}
    for batch in arrow_batches(group):
        for shard, i in zip(batch.column("shardId").to_pylist(), _ids(batch), strict=True):
            by_shard.setdefault(shard, []).append(i)
    first, second = group.parts[0].shard_id, group.parts[1].shard_id
    assert by_shard[first] == [orjson.loads(r.data)["id"] for r in recorded]
    assert len(set(by_shard[second])) == len(by_shard[second])
    assert len(set(ids) - set(by_shard[second])) > 5  # the first shard holds more than it replayed
    assert counting[0].reads == {"get": 0, "get_batch": 1}  # one read for both shards
