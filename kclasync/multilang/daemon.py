"""``kclasync multilang``: the MultiLangDaemon's job on kclasync's runtime.

Owns: starting the ``Consumer`` with one ``MultiLangProcessor`` per held shard, the notes on
unsupported properties (printed once, before anything starts), SIGTERM/SIGINT as a graceful
stop (each child gets ``shutdownRequested``, as the daemon's shutdown hook gives it), a failed
child as the daemon's ``System.exit(1)`` (a graceful stop, exit status 1; an answer timeout
stops abruptly), and killing any child still running when the worker returns.
Must not: decode properties (``settings``) or speak the protocol (``adapter``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from typing import TextIO

from kclasync._consumer import Consumer
from kclasync.multilang.adapter import MultiLangProcessor
from kclasync.multilang.child import Child, ChildFailedError
from kclasync.multilang.settings import MultiLangSettings

log = logging.getLogger("kclasync.multilang")


class MultiLangDaemon:
    """One worker: the consumer, its children, and how it stops."""

    def __init__(self, settings: MultiLangSettings) -> None:
        self.settings = settings
        self.children: set[Child] = set()
        self.exit_code = 0
        self._abrupt = False
        self._stopping: asyncio.Task[None] | None = None
        self.consumer = Consumer(
            stream_name=settings.stream,
            application_name=settings.application,
            processor=self._new_processor,
            config=settings.config,
            client_options=settings.client,
        )
        self._run: asyncio.Task[None] | None = None

    def _new_processor(self) -> MultiLangProcessor:
        return MultiLangProcessor(
            self.settings.command,
            on_failure=self._child_failed,
            children=self.children,
            timeout=self.settings.child_timeout,
            close_grace=self.settings.config.shutdown_timeout,
        )

    def _child_failed(self, shard_id: str, error: ChildFailedError, abrupt: bool) -> None:
        self.exit_code = 1
        if abrupt:
            log.error("stopping at once: %s", error)
            self._abrupt = True
            if self._run is not None:
                self._run.cancel()
            return
        log.error("stopping the worker (exit status 1): %s", error)
        self.stop()

    def stop(self) -> None:
        """A graceful stop: in-flight batches finish, children get shutdownRequested."""
        if self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_task(self.consumer.stop())

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop)
        self._run = asyncio.ensure_future(self.consumer.run())
        try:
            await self._run
        except asyncio.CancelledError:
            if not self._abrupt:
                raise
        finally:
            for child in list(self.children):
                child.kill()
            await asyncio.gather(
                *(c.proc.wait() for c in list(self.children)), return_exceptions=True
            )
            if self._stopping is not None:
                await asyncio.gather(self._stopping, return_exceptions=True)
        return self.exit_code


def print_notes(settings: MultiLangSettings, out: TextIO = sys.stderr) -> None:
    for note in settings.notes:
        print(f"kclasync multilang: {note}", file=out)


async def run_multilang(settings: MultiLangSettings) -> int:
    return await MultiLangDaemon(settings).run()
