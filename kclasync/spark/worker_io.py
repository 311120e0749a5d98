"""The AWS clients of one Spark Python worker process, kept for the life of the process.

Spark reuses its Python worker processes from task to task (``spark.python.worker.reuse``, on by
default). A task that made its own botocore session, loaded the service models and opened new
connections spent as long on that as on reading a few thousand records; here one private event
loop on a daemon thread holds, per connection settings, one session, one Kinesis client (also
used for enhanced fan-out), and one progress store, made by the first task that needs them and
used by every later one.

The clients are closed when the process exits normally (an ``atexit`` hook, in the process that
made them only), so that aiohttp does not report unclosed sessions on every worker's exit.

Owns: that loop, its clients and running a task's coroutine on it (``run``).
Must not: decide what to read or record (``kclasync.spark.source`` and ``fetch`` do), or be
shared across a fork (a child process builds its own: the loop's thread does not survive it).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync.spark.fetch import AwsOptions
from kclasync.spark.progress import ProgressStore, open_progress_store

__all__ = ["WorkerIO", "worker_io"]

T = TypeVar("T")


class WorkerIO:
    """Clients on a private event loop, made on first use and reused (one set per settings)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kclasync-spark-io", daemon=True
        )
        self._thread.start()
        self._closed = False
        atexit.register(self._close_at_exit)
        self._stack = contextlib.AsyncExitStack()
        self._sessions: dict[AwsOptions, Any] = {}
        self._kinesis: dict[AwsOptions, KinesisStreamClient] = {}
        self._fanout: dict[AwsOptions, FanOutClient] = {}
        self._stores: dict[tuple[AwsOptions, str | None, str], ProgressStore] = {}
        self._lock: asyncio.Lock | None = None
        #: Clients made so far, by service (a test checks that tasks reuse them).
        self.created: dict[str, int] = {}

    def run(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` on the private loop and wait for its result (from a task's thread)."""

        async def call() -> T:
            return await make()

        future = asyncio.run_coroutine_threadsafe(call(), self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # an interrupted task leaves nothing running behind it
            raise

    def submit(self, make: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """Start ``make()`` on the private loop without waiting; cancelling the returned future
        cancels the coroutine."""

        async def call() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(call(), self._loop)

    def _guard(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def _session(self, aws: AwsOptions) -> Any:
        session = self._sessions.get(aws)
        if session is None:
            session = self._sessions[aws] = aws.client_options().new_session()
        return session

    async def kinesis(self, aws: AwsOptions) -> KinesisStreamClient:
        """The Kinesis client for ``aws`` (called on the private loop)."""
        async with self._guard():
            client = self._kinesis.get(aws)
            if client is None:
                raw = await self._stack.enter_async_context(
                    aws.client_options().create_client("kinesis", self._session(aws))
                )
                client = self._kinesis[aws] = KinesisStreamClient(raw)
                self._fanout[aws] = FanOutClient(raw)
                self.created["kinesis"] = self.created.get("kinesis", 0) + 1
            return client

    async def fanout(self, aws: AwsOptions) -> FanOutClient:
        """Enhanced fan-out over the same Kinesis client (called on the private loop)."""
        await self.kinesis(aws)
        return self._fanout[aws]

    async def progress(
        self, aws: AwsOptions, metadata_path: str | None, table: str
    ) -> ProgressStore:
        """The progress store the options name (called on the private loop)."""
        key = (aws, metadata_path, table)
        async with self._guard():
            store = self._stores.get(key)
            if store is None:
                store = self._stores[key] = await open_progress_store(
                    self._stack, aws, metadata_path, table, session=self._session(aws)
                )
                self.created["progress"] = self.created.get("progress", 0) + 1
            return store

    def close(self, timeout: float | None = None) -> None:
        """Close every client (waiting at most ``timeout`` seconds) and stop the loop."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._close_at_exit)
        future = asyncio.run_coroutine_threadsafe(self._stack.aclose(), self._loop)
        with contextlib.suppress(Exception):
            future.result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    def _close_at_exit(self) -> None:
        # A forked child inherits the hook but not the loop's thread: only the maker closes.
        if os.getpid() == self.pid and self._thread.is_alive():
            self.close(timeout=EXIT_TIMEOUT)


#: Seconds the exit hook waits for the clients to close.
EXIT_TIMEOUT = 5.0

_current: WorkerIO | None = None
_guard = threading.Lock()


def worker_io() -> WorkerIO:
    """This process's ``WorkerIO`` (a new one after a fork)."""
    global _current
    with _guard:
        if _current is None or _current.pid != os.getpid():
            _current = WorkerIO()
        return _current
