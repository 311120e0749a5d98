"""The Spark source's AWS clients on the driver, for one query.

Spark calls the stream reader synchronously, in a Python process it starts for the query; this
keeps a private event loop there with one botocore session, the Kinesis client (also for
enhanced fan-out), the progress store and, with ``leaseTable``, the lease table's client.

Owns: opening, using (``run``) and closing those clients.
Must not: decide what to read or record (``kclasync.spark.source`` plans; executors use
``kclasync.spark.worker_io``), or be made on an executor (the reader makes it lazily, on the
driver only).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync.spark.options import SourceOptions
from kclasync.spark.progress import ProgressStore, open_progress_store

__all__ = ["DriverIO"]

T = TypeVar("T")


class DriverIO:
    """The driver's AWS clients on a private event loop (Spark calls the reader synchronously)."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._loop = asyncio.new_event_loop()
        self._stack = contextlib.AsyncExitStack()
        self.kinesis: KinesisStreamClient | None = None
        self.fanout: FanOutClient | None = None
        self.leases: DynamoLeaseStore | None = None
        self.progress: ProgressStore | None = None
        self.run(self._open)

    async def _open(self) -> None:
        client_options = self._options.aws.client_options()
        session = client_options.new_session()  # one set of service models for every client
        kinesis = await self._stack.enter_async_context(
            client_options.create_client("kinesis", session)
        )
        self.kinesis = KinesisStreamClient(kinesis)
        self.fanout = FanOutClient(kinesis)
        opts = self._options
        self.progress = await open_progress_store(
            self._stack, opts.aws, opts.metadata_path, opts.progress_table, session=session
        )
        if self._options.lease_table:
            ddb = await self._stack.enter_async_context(
                client_options.create_client("dynamodb", session)
            )
            self.leases = DynamoLeaseStore(ddb, self._options.lease_table)
            await self.leases.ensure_table()

    def run(self, make: Callable[[], Awaitable[T]]) -> T:
        async def call() -> T:
            return await make()

        return self._loop.run_until_complete(call())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.run(self._stack.aclose)
        self._loop.close()
