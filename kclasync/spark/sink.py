"""A kclasync record processor that hands every batch to Spark, and an idempotent parquet sink.

Owns: ``SparkProcessor`` (records -> Arrow -> Spark DataFrame -> the user's write function, run
in a thread so the event loop keeps renewing leases; the checkpoint only after the write
returned), ``BatchInfo`` (the batch's idempotence key: stream, shard, first and last sequence)
and ``ParquetSink`` (one parquet file per batch under a name made of that key, published with an
atomic rename, so a replay after a crash writes nothing twice).
Must not: touch leases or checkpoints other than through the ``Checkpointer`` it is handed.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from kclasync._processor import Checkpointer, ShardInfo
from kclasync._records import Record
from kclasync.spark.schema import records_to_arrow

__all__ = ["BatchInfo", "ParquetSink", "ResumableWriter", "SparkProcessor"]


@attrs.frozen
class BatchInfo:
    """Which records a DataFrame holds. ``(stream, shard_id, first_sequence, last_sequence)``
    names the batch: after a crash the shard is read again from its checkpoint, so a replayed
    batch starts at the same ``first_sequence`` (it may end elsewhere)."""

    stream: str
    shard_id: str
    first_sequence: str
    last_sequence: str
    records: int

    @property
    def key(self) -> str:
        return f"{self.stream}/{self.shard_id}/{self.first_sequence}-{self.last_sequence}"


WriteBatch = Callable[[Any, BatchInfo], None]
"""``write(df, info)``: a blocking function that writes one batch's DataFrame."""


@runtime_checkable
class ResumableWriter(Protocol):
    """A write function that can say how far a shard has already been written. The processor
    then drops already-written records from a replayed batch before calling it."""

    def __call__(self, df: Any, info: BatchInfo) -> None: ...

    def last_written(self, stream: str, shard_id: str) -> str | None:
        """The highest sequence number written for the shard, or None."""


class SparkProcessor:
    """Runs a Spark write per batch for a kclasync ``Consumer`` (one instance per shard).

    >>> sink = ParquetSink("/data/orders")
    >>> Consumer(..., processor=SparkProcessor.factory(spark, sink))

    Each batch becomes a DataFrame with the ``kclasync.spark.schema`` columns (built through
    Arrow, no pandas). ``write(df, info)`` runs in a worker thread; the batch is checkpointed
    after it returns, so a crash in between replays the batch: make the write idempotent per
    ``info.key``, or give a ``ResumableWriter`` (``ParquetSink`` is one).
    """

    def __init__(self, spark: Any, write: WriteBatch) -> None:
        self.spark = spark
        self.write = write
        self.shard: ShardInfo | None = None
        self._written_up_to: int | None = None
        self.batches_written = 0

    @classmethod
    def factory(cls, spark: Any, write: WriteBatch) -> Callable[[], SparkProcessor]:
        return lambda: cls(spark, write)

    async def initialize(self, shard: ShardInfo) -> None:
        self.shard = shard
        if isinstance(self.write, ResumableWriter):
            last = await asyncio.to_thread(self.write.last_written, shard.stream, shard.shard_id)
            self._written_up_to = int(last) if last is not None else None

    def _fresh(self, records: Sequence[Record]) -> list[Record]:
        if self._written_up_to is None:
            return list(records)
        done = self._written_up_to
        return [r for r in records if int(r.sequence_number) > done]

    def _write_sync(self, records: list[Record], info: BatchInfo) -> None:
        table = records_to_arrow(records, info.stream)
        df = self.spark.createDataFrame(_as_table(table))
        self.write(df, info)

    async def process_records(
        self,
        records: Sequence[Record],
        checkpointer: Checkpointer,
        millis_behind_latest: int | None,
    ) -> None:
        assert self.shard is not None
        fresh = self._fresh(records)
        if fresh:
            info = BatchInfo(
                stream=self.shard.stream,
                shard_id=self.shard.shard_id,
                first_sequence=fresh[0].sequence_number,
                last_sequence=fresh[-1].sequence_number,
                records=len(fresh),
            )
            await asyncio.to_thread(self._write_sync, fresh, info)
            self.batches_written += 1
            if self._written_up_to is not None or isinstance(self.write, ResumableWriter):
                self._written_up_to = int(info.last_sequence)
        await checkpointer.checkpoint()

    async def lease_lost(self) -> None:
        return None

    async def shard_ended(self, checkpointer: Checkpointer) -> None:
        await checkpointer.checkpoint_shard_end()

    async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        # Every delivered batch was written and checkpointed before the next one started.
        if checkpointer.last_delivered not in (None, checkpointer.last_checkpoint):
            await checkpointer.checkpoint()


def _as_table(batch: Any) -> Any:
    import pyarrow as pa

    return pa.Table.from_batches([batch])


class ParquetSink:
    """Writes each batch to ``<path>/stream=<stream>/shardId=<shard>/<first>-<last>.parquet``.

    Spark writes the batch into a scratch directory under ``<path>/.staging`` (hidden, so
    neither Spark's reader nor a ``**/*.parquet`` glob sees it); its one part file is then
    renamed to the final name, which is atomic on one filesystem: a batch file exists whole or
    not at all. ``spark.read.parquet(path)`` reads everything, with ``stream`` and ``shardId``
    as partition columns. ``last_written`` lets ``SparkProcessor`` skip records a crashed
    worker wrote but did not checkpoint.

    A worker that dies mid-write leaves its scratch directory behind. A new sink removes
    scratch directories untouched for ``stale_after`` seconds (default 10 minutes; one
    batch's write takes far less, so a live worker's are kept) when it is created;
    ``cleaned`` says how many.
    """

    STAGING = ".staging"
    #: The scratch directory's name before it was hidden; cleaned the same way.
    OLD_STAGING = "_staging"

    def __init__(self, path: str, *, stale_after: float = 600.0) -> None:
        self.path = os.path.abspath(path)
        self.cleaned = self.clean_staging(stale_after)

    def clean_staging(self, stale_after: float) -> int:
        """Remove scratch directories not modified for ``stale_after`` seconds."""
        now = time.time()
        removed = 0
        for name in (self.STAGING, self.OLD_STAGING):
            root = os.path.join(self.path, name)
            for entry in _listdir(root):
                scratch = os.path.join(root, entry)
                try:
                    age = now - _newest_mtime(scratch)
                except FileNotFoundError:
                    continue
                if age >= stale_after:
                    shutil.rmtree(scratch, ignore_errors=True)
                    removed += 1
            with contextlib.suppress(OSError):
                os.rmdir(root)  # only when empty
        return removed

    def _shard_dir(self, stream: str, shard_id: str) -> str:
        return os.path.join(self.path, f"stream={stream}", f"shardId={shard_id}")

    def __call__(self, df: Any, info: BatchInfo) -> None:
        directory = self._shard_dir(info.stream, info.shard_id)
        final = os.path.join(directory, f"{info.first_sequence}-{info.last_sequence}.parquet")
        if os.path.exists(final):
            return  # written before a crash, not checkpointed: nothing to do
        staging = os.path.join(self.path, self.STAGING, uuid.uuid4().hex)
        try:
            df.drop("stream", "shardId").coalesce(1).write.parquet(staging)
            parts = glob.glob(os.path.join(staging, "part-*.parquet"))
            if len(parts) != 1:
                raise RuntimeError(f"expected one part file in {staging}, found {parts}")
            os.makedirs(directory, exist_ok=True)
            os.replace(parts[0], final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def last_written(self, stream: str, shard_id: str) -> str | None:
        ends = [
            int(name.removesuffix(".parquet").rsplit("-", 1)[1])
            for name in _listdir(self._shard_dir(stream, shard_id))
            if name.endswith(".parquet") and "-" in name
        ]
        return str(max(ends)) if ends else None


def _newest_mtime(path: str) -> float:
    newest = os.stat(path).st_mtime
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            with contextlib.suppress(FileNotFoundError):
                newest = max(newest, os.stat(os.path.join(root, name)).st_mtime)
    return newest


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
