"""Leader election through the heartbeat lock item in the coordinator-state table.

Owns: the loop that reads the lock, asks ``core.leader_lock`` what to do, and applies it (create,
take over, heartbeat), and releasing the lock on a graceful stop. The term written and the pace
of reads and writes come from ``core.lock_term``: the leader's failover watch tells the elector
whether the registry shows a worker of another implementation (``observe_fleet``); in a
kclasync-only fleet the lock lasts one failover time and is written four times per term, else
the configured term (the Java KCL's 120 s). The holder names its successors in the item
(``core.lock_term.successors``, from the alive workers its watch reports); a worker that does
not hold the lock reads it at the pace of ``core.lock_term.watch_interval``: fast when named
or when the item names an empty list, else at the configured interval. The ``Consumer`` runs
the leader-only duties (periodic shard sync, the hash-range auditor, finished-lease cleanup) while
``is_leader()`` holds.
Must not: read any clock but the event loop's; decide expiry itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

from kclasync._adapters.protocols import CoordinatorStateStore
from kclasync._core.leases.leader_lock import LEADER_LOCK_KEY, LeaderLockState, LockAction
from kclasync._core.leases.lock_term import (
    LockTerm,
    lock_interval,
    lock_term,
    successors,
    watch_interval,
)
from kclasync._runtime.event_wait import wait_event
from kclasync.errors import AdapterError

log = logging.getLogger("kclasync.leader")


class LeaderElector:
    """One worker's side of the election. ``run()`` loops until cancelled.

    Every ``heartbeat_interval`` the lock item is read (strongly) and the core's decision applied.
    A worker that holds the lock leads while its last successful write was sent less than
    ``lock_duration`` ago; another worker takes the lock over once it has seen the same record
    version for ``lock_duration`` on its own clock, so a dead leader is replaced within about
    ``lock_duration + heartbeat_interval``. With ``failover_time`` given and a kclasync-only
    fleet reported (``observe_fleet(False)``) the leader writes the short term of
    ``core.lock_term`` instead, and names its successors; with ``failover_time`` given the
    successors read at that term's pace (``core.lock_term.watch_interval``), the others at
    the configured one.
    """

    def __init__(
        self,
        *,
        store: CoordinatorStateStore,
        worker_id: str,
        lock_duration: float,
        heartbeat_interval: float,
        rng: random.Random,
        clock: Callable[[], float] | None = None,
        key: str = LEADER_LOCK_KEY,
        failover_time: float | None = None,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.lock_duration = lock_duration
        self.heartbeat_interval = heartbeat_interval
        self.key = key
        self.state = LeaderLockState(worker_id)
        self._rng = rng
        self._clock = clock
        #: Times this worker became leader.
        self.terms = 0
        self._wakers: list[asyncio.Event] = []
        self.failover_time = failover_time
        #: Whether the leader's last read of the registry showed a worker of another
        #: implementation (None: not read in this term).
        self._others: bool | None = None
        #: The kclasync workers the leader's last read of the registry showed alive (None:
        #: not read in this term): whom it may name as successors.
        self._alive: frozenset[str] | None = None
        #: Set when the term to write changed: the holder writes at once.
        self._rewrite = asyncio.Event()

    def now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def is_leader(self) -> bool:
        return self.state.is_leader(self.now())

    def leader_id(self) -> str | None:
        """This worker when it leads, else the owner the lock named at its last read (None:
        no lock, or a released one). The named owner may be dead: the lock expires later."""
        if self.is_leader():
            return self.worker_id
        return self.state.seen_owner

    def previous_owner(self) -> str | None:
        """The owner the lock named at this worker's last read (the one before its term when
        it leads; None: no lock, or a released one)."""
        return self.state.seen_owner

    def subscribe(self) -> asyncio.Event:
        """An event set each time this worker becomes leader (the subscriber clears it)."""
        event = asyncio.Event()
        self._wakers.append(event)
        return event

    def term(self) -> LockTerm:
        """The term this worker writes when it writes the lock now."""
        return lock_term(
            configured_duration=self.lock_duration,
            configured_interval=self.heartbeat_interval,
            failover_time=self.failover_time,
            others_present=self._others,
        )

    def interval(self) -> float:
        """Seconds until the next read: the pace of the item held, or the watch's pace."""
        state = self.state
        held = state.held_duration
        if held is not None:
            return lock_interval(self.heartbeat_interval, held, self.failover_time)
        seen = state.seen_duration
        if seen is None:  # no item: the next holder names nobody yet
            return lock_interval(self.heartbeat_interval, self.lock_duration, self.failover_time)
        return watch_interval(
            self.worker_id,
            configured_interval=self.heartbeat_interval,
            duration=seen,
            failover_time=self.failover_time,
            named=state.seen_successors,
        )

    def successors(self, previous: tuple[str, ...] | None) -> tuple[str, ...] | None:
        """The successors to name in a write now (None: the short term is off). Before the
        registry was read in this term: the item's named ones but this worker, else none
        (an empty list: every worker reads fast until the names come)."""
        if self.failover_time is None:
            return None
        if self._alive is None:
            return tuple(worker for worker in previous or () if worker != self.worker_id)
        return successors(self.worker_id, self._alive, previous)

    def observe_fleet(
        self, others_present: bool | None, alive: frozenset[str] | set[str] | None = None
    ) -> None:
        """The leader's failover watch read the registry (None: this worker stopped watching),
        and showed ``alive`` kclasync workers. When the term to write changes while this
        worker holds the lock, it writes at once."""
        self._others = others_present
        self._alive = None if alive is None else frozenset(alive)
        held = self.state.held_duration
        if held is not None and held != self.term().duration:
            self._rewrite.set()

    def _new_version(self) -> str:
        return f"{self._rng.getrandbits(128):032x}"

    async def step(self) -> bool:
        """Read the lock once and act on it. Returns whether this worker leads afterwards."""
        was_leader = self.is_leader()
        item = await self.store.get_lock(self.key)
        now = self.now()
        self.state.observe(item, now)
        decision = self.state.decide(item, now)
        sent = self.now()
        duration = self.term().duration
        if decision.action is LockAction.CREATE:
            written = await self.store.create_lock(
                self.key, self.worker_id, duration, self._new_version(), self.successors(None)
            )
        elif decision.action in (LockAction.TAKE, LockAction.HEARTBEAT):
            assert decision.expected_version is not None
            written = await self.store.replace_lock(
                self.key,
                decision.expected_version,
                self.worker_id,
                duration,
                self._new_version(),
                self.successors(item.successors if item is not None else None),
            )
        else:
            return self.is_leader()
        if written is None:
            if decision.action is LockAction.HEARTBEAT:
                log.warning("worker %s lost the leader lock", self.worker_id)
            self.state.lost()
            return False
        self.state.written(written, sent)
        if not was_leader and self.is_leader():
            self.terms += 1
            log.info("worker %s is the leader (%s)", self.worker_id, decision.action.value)
            for event in self._wakers:
                event.set()
        return self.is_leader()

    async def run(self) -> None:
        while True:
            started = self.now()
            try:
                await self.step()
            except AdapterError as exc:
                log.info("leader lock round failed (%s); will retry", exc)
            delay = max(0.0, self.interval() - (self.now() - started))
            await wait_event(self._rewrite, delay)
            self._rewrite.clear()

    async def release(self) -> None:
        """Give the lock up (graceful stop) so another worker leads at once. A heartbeat
        cancelled in flight (the stop cancels this loop) may have landed without this worker
        seeing its version: when the delete on the version it knows is refused, the lock is
        read again and, if this worker still owns it, deleted on the version found."""
        version = self.state.held_version
        self.state.lost()
        if version is None:
            return
        with contextlib.suppress(AdapterError):
            released = await self.store.release_lock(
                self.key, version, self.worker_id, self._new_version()
            )
            if not released:
                item = await self.store.get_lock(self.key)
                if item is not None and item.owner == self.worker_id:
                    released = await self.store.release_lock(
                        self.key, item.record_version, self.worker_id, self._new_version()
                    )
            if released:
                log.info("worker %s released the leader lock", self.worker_id)
