"""The worker's GetRecords calls in flight, over all its shards, bounded by a limit that gives
way to lease renewals (``core.records.read_admission``).

``ReadSlots`` is a semaphore whose size can change while it is in use: a read waits for a slot
(first come, first served) while ``limit`` reads are in flight. Renewals report their lateness
(``observe``); the admission decides the limit, and a cut applies as the reads in flight end.

Owns: the slots, the limit's gauge and the log lines when the limit changes.
Must not: decide the limit (core does) or read a clock other than the one it is given.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from types import TracebackType

from kclasync._core.records.read_admission import ReadAdmission, admit_reads

log = logging.getLogger("kclasync.reads")


class ReadSlots:
    """At most ``limit`` holders at once; with ``adaptive``, renewals' lateness moves the
    limit between 1 and ``ceiling``."""

    def __init__(
        self,
        ceiling: int,
        *,
        failover_time: float,
        clock: Callable[[], float],
        adaptive: bool = True,
        on_limit: Callable[[int], None] | None = None,
    ) -> None:
        self.ceiling = ceiling
        self.failover_time = failover_time
        self.adaptive = adaptive
        self._clock = clock
        self._on_limit = on_limit
        self._admission = ReadAdmission(ceiling, clock())
        #: Reads in flight (slots granted and not yet given back).
        self.in_use = 0
        #: The lowest limit this worker has set (read by tests and benchmarks).
        self.lowest = ceiling
        self._cut_logged_at: float | None = None
        self._waiters: deque[asyncio.Future[None]] = deque()
        if on_limit is not None:
            on_limit(ceiling)

    @property
    def limit(self) -> int:
        return self._admission.limit

    async def __aenter__(self) -> None:
        if self.in_use < self.limit and not self._waiters:
            self.in_use += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # granted, then cancelled before it ran: pass the slot on
            else:
                self._waiters.remove(waiter)
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release()

    def _release(self) -> None:
        self.in_use -= 1
        self._grant()

    def _grant(self) -> None:
        """Hand free slots to the first waiters (a slot is taken when granted, so a read that
        comes later cannot pass a woken one)."""
        while self._waiters and self.in_use < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_use += 1
                waiter.set_result(None)

    def observe(self, lateness: float) -> None:
        """A renewal was sent ``lateness`` seconds after it was due."""
        if not self.adaptive:
            return
        before, worst = self._admission.limit, max(lateness, self._admission.worst or 0.0)
        now = self._clock()
        self._admission = admit_reads(
            self._admission,
            lateness=lateness,
            now=now,
            failover_time=self.failover_time,
            ceiling=self.ceiling,
        )
        after = self._admission.limit
        if after == before:
            return
        self.lowest = min(self.lowest, after)
        if self._on_limit is not None:
            self._on_limit(after)
        if after < before and (self._cut_logged_at is None or now - self._cut_logged_at >= 60):
            self._cut_logged_at = now  # at most a line a minute while it goes on
            log.info(
                "lease renewals are running late (%.3f s): reads in flight cut to %d of %d",
                worst,
                after,
                self.ceiling,
            )
        elif after == self.ceiling:
            log.info("lease renewals on time again: reads in flight back to %d", after)
        self._grant()
