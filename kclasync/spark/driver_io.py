"""The Spark source's AWS clients on the driver, for one query.

Spark calls the stream reader synchronously, in a Python process it starts for the query; this
keeps a private event loop there, running on a thread of its own, with one botocore session,
the Kinesis client (also for enhanced fan-out), the progress store and, with ``leaseTable``,
the lease table's client.

Owns: opening, using (``run``; ``spawn``: work that goes on while Spark does its own between two
calls of the reader) and closing those clients, and knowing whether this process is
Spark's streaming source runner (``in_source_runner``), where the reader opens them on a thread
as soon as Spark makes it, so that a query's first planning does not wait for them.
Must not: decide what to read or record (``kclasync.spark.source`` plans; executors use
``kclasync.spark.worker_io``), or be made on an executor (the reader makes it lazily, on the
driver only).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync.spark.options import SourceOptions
from kclasync.spark.progress import ProgressStore, open_progress_store

__all__ = ["RUNNER", "DriverClients", "DriverIO", "in_source_runner"]

#: The module Spark runs (``python -m``) as a streaming query's driver-side Python process: it
#: makes the reader once and calls it for every planning and commit of the query.
RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def in_source_runner() -> bool:
    """Whether this process is Spark's streaming source runner (elsewhere, e.g. a Python worker
    that pickles the reader's read function for the executors, the reader plans nothing)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == RUNNER


T = TypeVar("T")


class DriverIO:
    """The driver's AWS clients on a private event loop (Spark calls the reader synchronously);
    the loop runs on its own thread, so work ``spawn``ed goes on between the reader's calls."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kclasync-driver-loop", daemon=True
        )
        self._thread.start()
        self._stack = contextlib.AsyncExitStack()
        self.kinesis: KinesisStreamClient | None = None
        self.fanout: FanOutClient | None = None
        self.leases: DynamoLeaseStore | None = None
        self.progress: ProgressStore | None = None
        try:
            self.run(self._open)
        except BaseException:
            self.close()
            raise

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
        """``make()`` run on the loop, waited for."""
        return self.spawn(make).result()

    def spawn(self, make: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """``make()`` started on the loop, not waited for (cancel the future to stop it)."""

        async def call() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(call(), self._loop)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.run(self._stack.aclose)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()


class DriverClients:
    """The reader's ``DriverIO``: opened at its first use, or earlier on a thread
    (``open_early``: botocore loads its service models, 0.1-0.3 s of CPU here, while Spark
    starts the query rather than in its first planning); closed by ``close``."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._io: DriverIO | None = None
        self._opening: concurrent.futures.Future[DriverIO] | None = None

    def open_early(self) -> None:
        if self._io is None and self._opening is None:
            pool = concurrent.futures.ThreadPoolExecutor(1, "kclasync-driver-io")
            self._opening = pool.submit(DriverIO, self._options)
            pool.shutdown(wait=False)

    def get(self) -> DriverIO:
        """The clients (an error of an early opening is raised here, at the first use)."""
        if self._io is None:
            opening, self._opening = self._opening, None
            self._io = opening.result() if opening is not None else DriverIO(self._options)
        return self._io

    def close(self) -> None:
        opening, self._opening = self._opening, None
        if opening is not None and opening.exception() is None:
            opening.result().close()
        if self._io is not None:
            self._io.close()
            self._io = None
