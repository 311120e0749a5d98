"""Leader election through the heartbeat lock item in the coordinator-state table.

Owns: the loop that reads the lock, asks ``core.leader_lock`` what to do, and applies it (create,
take over, heartbeat), and releasing the lock on a graceful stop. The ``Consumer`` runs the
leader-only duties (periodic shard sync, the hash-range auditor, finished-lease cleanup) while
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
from kclasync.errors import AdapterError

log = logging.getLogger("kclasync.leader")


class LeaderElector:
    """One worker's side of the election. ``run()`` loops until cancelled.

    Every ``heartbeat_interval`` the lock item is read (strongly) and the core's decision applied.
    A worker that holds the lock leads while its last successful write was sent less than
    ``lock_duration`` ago; another worker takes the lock over once it has seen the same record
    version for ``lock_duration`` on its own clock, so a dead leader is replaced within about
    ``lock_duration + heartbeat_interval``.
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

    def subscribe(self) -> asyncio.Event:
        """An event set each time this worker becomes leader (the subscriber clears it)."""
        event = asyncio.Event()
        self._wakers.append(event)
        return event

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
        if decision.action is LockAction.CREATE:
            written = await self.store.create_lock(
                self.key, self.worker_id, self.lock_duration, self._new_version()
            )
        elif decision.action in (LockAction.TAKE, LockAction.HEARTBEAT):
            assert decision.expected_version is not None
            written = await self.store.replace_lock(
                self.key,
                decision.expected_version,
                self.worker_id,
                self.lock_duration,
                self._new_version(),
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
            await asyncio.sleep(max(0.0, self.heartbeat_interval - (self.now() - started)))

    async def release(self) -> None:
        """Give the lock up (graceful stop) so another worker leads at once."""
        version = self.state.held_version
        self.state.lost()
        if version is None:
            return
        with contextlib.suppress(AdapterError):
            if await self.store.release_lock(
                self.key, version, self.worker_id, self._new_version()
            ):
                log.info("worker %s released the leader lock", self.worker_id)
