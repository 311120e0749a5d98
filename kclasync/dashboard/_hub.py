"""The dashboard's poll loop and its subscribers (the open pages).

Owns: polling the fleet while at least one page listens, and handing every new document to each
listener (a slow listener skips to the newest document; it never queues them up).
Must not: know about HTTP (the servers in ``_aiohttp`` and ``_asgi`` do) or the table formats.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from kclasync._adapters.aws import ClientOptions
from kclasync._observations import (
    LeaseTracker,
    Recording,
    RecordingWriter,
    lease_reads,
    workers_line,
)
from kclasync.dashboard._history import FleetHistory, replay_document
from kclasync.dashboard._source import FleetSource
from kclasync.dashboard._view import FleetRead, FleetView

log = logging.getLogger("kclasync.dashboard")


class Dashboard:
    """One application's live view, shared by every page that shows it.

    Polling starts with the first listener and stops when the last one leaves, so a dashboard
    mounted into a service costs nothing while nobody looks at it.
    """

    def __init__(
        self,
        application: str,
        *,
        client_options: ClientOptions | None = None,
        table: str | None = None,
        metrics_urls: Sequence[str] = (),
        interval: float = 1.0,
        record: RecordingWriter | None = None,
        metrics_text: Callable[[], str] | None = None,
        replay: Recording | None = None,
    ) -> None:
        """``record``: where to write what each read observes (see ``kclasync._observations``);
        ``replay``: show this recording instead of reading the fleet."""
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.source = FleetSource(
            application,
            client_options=client_options,
            table=table,
            metrics_urls=metrics_urls,
            metrics_text=metrics_text,
        )
        self.view = FleetView(application, self.source.table)
        self.interval = interval
        self.tracker = LeaseTracker()
        self.history = FleetHistory()
        self.recorder = record
        self._latest: str | None = None
        self.replaying = replay is not None
        if replay is not None:
            self.history = FleetHistory(samples=max(1, len(replay.observations)))
            self.history.add(replay.observations)
            self._latest = json.dumps(replay_document(application, replay, self.history))
        self._listeners: set[asyncio.Queue[str]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()

    @property
    def latest(self) -> str | None:
        """The newest document as JSON, or None before the first poll."""
        return self._latest

    @property
    def polling(self) -> bool:
        """True while the poll loop runs (at least one page is listening)."""
        return self._poller is not None

    def _publish(self, read: FleetRead) -> None:
        loop = asyncio.get_running_loop()
        wall = time.time()
        document = self.view.update(read, loop.time(), wall)
        observations = []
        if read.leases_read:  # a failed read says nothing of the leases
            observations = self.tracker.observe(wall, lease_reads(document["leases"]))
            observations.append(workers_line(wall, document["workers"]))
        if self.recorder is not None:
            self.recorder.write_all(observations)
        document["timeline_update"] = self.history.add(observations)
        document["sample"] = self.history.samples[-1] if observations else None
        self._latest = json.dumps(document, separators=(",", ":"))
        for queue in self._listeners:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(self._latest)

    def _publish_failure(self, exc: Exception) -> None:
        """A poll that could not even start (no region, bad credentials configuration): the
        page shows the reason instead of waiting silently."""
        log.debug("dashboard poll failed", exc_info=exc)
        self._publish(FleetRead(leases=(), errors=(f"{type(exc).__name__}: {exc}",)))

    async def _poll_once(self, source: FleetSource) -> None:
        self._publish(await source.read())

    async def _poll(self) -> None:
        try:
            # The outer loop re-opens the clients for a listener that arrived while they were
            # being closed; between its last check and the reset below nothing awaits.
            while self._listeners:
                try:
                    async with self.source.open() as source:
                        while self._listeners:
                            try:
                                await self._poll_once(source)
                            except Exception as exc:  # a bad poll must not end the updates
                                self._publish_failure(exc)
                            await asyncio.sleep(self.interval)
                except Exception as exc:  # the clients could not be created
                    self._publish_failure(exc)
                    await asyncio.sleep(self.interval)
        finally:
            self._poller = None

    def history_document(self) -> dict[str, Any]:
        """The timeline and series remembered so far (for a page that loads)."""
        return self.history.document()

    async def snapshot(self) -> dict[str, Any]:
        """The current document (one read of its own when nobody is listening)."""
        if not self.replaying and (self._latest is None or self._poller is None):
            try:
                async with self.source.open() as source:
                    await self._poll_once(source)
            except Exception as exc:
                self._publish_failure(exc)
        assert self._latest is not None
        result: dict[str, Any] = json.loads(self._latest)
        return result

    @contextlib.asynccontextmanager
    async def listen(self) -> AsyncIterator[asyncio.Queue[str]]:
        """A queue that receives each new document (JSON), starting with the current one."""
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=1)
        if self._latest is not None:
            queue.put_nowait(self._latest)
        self._listeners.add(queue)
        if self._poller is None and not self._closed.is_set() and not self.replaying:
            self._poller = asyncio.create_task(self._poll(), name="kclasync dashboard poll")
        try:
            yield queue
        finally:
            self._listeners.discard(queue)

    async def next(self, queue: asyncio.Queue[str], timeout: float) -> str | None:
        """The next document from a ``listen()`` queue; "" when none came within ``timeout``
        seconds (time for a keep-alive); None once the dashboard is closed (end the stream)."""
        if self._closed.is_set():
            return None
        getter = asyncio.ensure_future(queue.get())
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait(
                {getter, closed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            closed.cancel()
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
        return None if self._closed.is_set() else ""

    async def close(self) -> None:
        """Stop polling, end every open event stream, close the recording."""
        self._closed.set()
        self._listeners.clear()
        poller = self._poller
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        if self.recorder is not None:
            self.recorder.close()
