"""Reading one shard with GetRecords: the iterator, backoff, and expired-iterator recovery.

Owns: turning "give me the next records of this shard" into GetShardIterator/GetRecords calls
that back off on throttling and transient errors and, when an iterator expires, resume right
after the last record already returned (nothing lost, nothing twice). Used by the workers'
per-shard fetchers and by the Spark source's executors.
Must not: decide what to do with the records, or read any clock but the event loop's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from kclasync._adapters.protocols import (
    ExpiredIteratorError,
    GetRecordsResult,
    IteratorType,
    StartingPosition,
    StreamClient,
)
from kclasync._core.retry_policy import Backoff
from kclasync._runtime.read_slots import ReadSlots
from kclasync.errors import ThrottledError, TransientError

log = logging.getLogger("kclasync.shard")

T = TypeVar("T")


class ShardCursor:
    """The position of one reader in one shard.

    ``attempts``: calls tried per step before the error is raised (None: retry forever).
    The waits (``retry_policy.Backoff``) start at ``backoff`` and double up to ``max_backoff``
    (no jitter: one reader per shard).
    ``on_throttle``: called once per throttling error (for metrics).
    """

    def __init__(
        self,
        client: StreamClient,
        stream: str,
        shard_id: str,
        start: StartingPosition,
        *,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
        attempts: int | None = None,
        on_throttle: Callable[[], None] | None = None,
        on_retry: Callable[[str, BaseException], None] | None = None,
        read_slots: ReadSlots | None = None,
    ) -> None:
        self.client = client
        #: Shared by the worker's shards: a GetRecords call holds one while it is in flight
        #: (not while it backs off).
        self.read_slots = read_slots
        self.stream = stream
        self.shard_id = shard_id
        self.start = start
        self.backoff = Backoff(backoff, max_backoff)
        self.attempts = attempts
        self.on_throttle = on_throttle
        self.on_retry = on_retry
        self.iterator: str | None = None
        #: Sequence number of the last record returned (where an expired iterator resumes).
        self.last_sequence: str | None = None

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                return await call()
            except (ThrottledError, TransientError) as exc:
                if isinstance(exc, ThrottledError) and self.on_throttle is not None:
                    self.on_throttle()
                if self.attempts is not None and attempt >= self.attempts:
                    raise
                if self.on_retry is not None:
                    self.on_retry(what, exc)
                delay = self.backoff.delay(attempt)
                log.info("%s on %s failed (%s); retrying in %.2fs", what, self.shard_id, exc, delay)
                await asyncio.sleep(delay)

    async def fresh_iterator(self) -> str:
        """A new iterator where the next read starts (the start, or after the last record)."""
        position = (
            StartingPosition(IteratorType.AFTER_SEQUENCE_NUMBER, self.last_sequence)
            if self.last_sequence is not None
            else self.start
        )
        return await self._retrying(
            "GetShardIterator",
            lambda: self.client.get_shard_iterator(self.stream, self.shard_id, position),
        )

    async def _get_records(self, iterator: str, limit: int) -> GetRecordsResult:
        if self.read_slots is None:
            return await self.client.get_records(self.stream, self.shard_id, iterator, limit)
        async with self.read_slots:
            return await self.client.get_records(self.stream, self.shard_id, iterator, limit)

    async def next(self, limit: int) -> GetRecordsResult:
        """One GetRecords result. ``next_iterator`` None means the shard ended.

        Raises ``ShardNotFoundError`` when the shard is gone, and the last throttling or
        transient error once ``attempts`` are used up.
        """
        while True:
            if self.iterator is None:
                self.iterator = await self.fresh_iterator()
            try:
                result = await self._retrying(
                    "GetRecords", functools.partial(self._get_records, self.iterator, limit)
                )
            except ExpiredIteratorError:
                log.info(
                    "iterator of %s expired; resuming after %s", self.shard_id, self.last_sequence
                )
                self.iterator = None
                continue
            if result.records:
                self.last_sequence = result.records[-1].sequence_number
            self.iterator = result.next_iterator
            return result
