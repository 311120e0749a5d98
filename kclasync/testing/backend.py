"""``MemoryBackend``: a consumer's lease table, lock items, worker registry and streams in
memory, for testing a processor without AWS and without an emulator.

Owns: the in-memory state one backend's consumers share (they form one fleet), and the
producer helpers a test needs (create a stream, put records, read the checkpoints).
Must not: be used for anything but tests and demos (nothing survives the process), or read any
clock but the event loop's (a virtual-time loop works).
"""

from __future__ import annotations

import asyncio
import contextlib

from kclasync._adapters.backends import Adapters, Backend, OnRetry
from kclasync._adapters.memory import (
    MemoryCoordinatorState,
    MemoryLeaseStore,
    MemoryLeaseTable,
    MemoryStreamClient,
)
from kclasync._core.leases.position import Checkpoint

__all__ = ["MemoryBackend"]


class MemoryBackend(Backend):
    """Streams and a lease table in memory: ``Consumer(..., backend=MemoryBackend())``.

    Every consumer given the same backend joins the same fleet (one lease table, one leader
    lock, one worker registry), so a test can run several workers and watch the shards move.
    Records put with ``put_record`` are read by the consumers as from Kinesis; ``checkpoints``
    shows what the processors checkpointed.
    """

    def __init__(self) -> None:
        self._table = MemoryLeaseTable()
        self._kinesis = MemoryStreamClient()
        self._locks = MemoryCoordinatorState()

    def create_stream(self, name: str, shard_count: int = 1) -> None:
        """Create a stream of ``shard_count`` open shards (``shardId-000000000000``, ...)."""
        self._kinesis.create_stream(name, shard_count)

    def put_record(self, stream: str, partition_key: str, data: bytes) -> tuple[str, str]:
        """Put one record, as Kinesis ``PutRecord`` does: returns (shard id, sequence
        number)."""
        return self._kinesis.put_record(stream, partition_key, data)

    def checkpoints(self) -> dict[str, Checkpoint]:
        """The checkpoint of every lease, by lease key (the shard id for a single stream)."""
        return {key: lease.checkpoint for key, lease in self._table.leases.items()}

    async def _connect(
        self, stack: contextlib.AsyncExitStack, table_name: str, *, on_retry: OnRetry = None
    ) -> Adapters:
        # One store per worker over the shared table; the lock items shared by all.
        store = MemoryLeaseStore(self._table)
        return Adapters(
            store=store,
            stream_client=self._kinesis,
            locks=self._locks.shared(),
            registry=store.worker_registry(),
            wall_clock=asyncio.get_running_loop().time,
        )
