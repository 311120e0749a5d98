"""The event faults of a simulation: crashes, pauses, graceful stops, throttling windows and
resharding, each arriving as a Poisson process at its ``faults.RATE_PER_HOUR``.

Owns: ``FaultInjector`` (when each fault happens and which worker or shard it hits).
Must not: implement what a fault does to a worker (``fleet`` does) or use unseeded randomness.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

from kclasync._adapters.memory import FaultPlan, MemoryStream
from kclasync._simulation.faults import RATE_PER_HOUR, store_faults
from kclasync._simulation.fleet import Fleet
from kclasync._simulation.settings import SimulationSettings
from kclasync._simulation.worker import SimWorker


class FaultInjector:
    def __init__(
        self,
        fleet: Fleet,
        settings: SimulationSettings,
        *,
        rng: random.Random,
        store_plan: FaultPlan,
        stream: MemoryStream,
        events: Counter[str],
    ) -> None:
        self.fleet = fleet
        self.settings = settings
        self.rng = rng
        self.store_plan = store_plan
        self.stream = stream
        self.events = events

    def _pick(self, *, allow_paused: bool = False, leader: bool = False) -> SimWorker | None:
        """A live worker to fault (``leader``: the one that leads), or None when a third of the
        fleet is already in trouble (or, for ``leader``, none leads now)."""
        candidates = [w for w in self.fleet.live_workers() if allow_paused or not w.paused]
        troubled = self.settings.workers - len(candidates)
        if len(candidates) <= 1 or troubled >= max(1, self.settings.workers // 3):
            return None
        if leader:
            leading = [w for w in candidates if w.consumer is not None and w.consumer.is_leader]
            return leading[0] if leading else None
        return self.rng.choice(candidates)

    async def inject(self, kind: str) -> None:
        """Inject faults of one kind until cancelled."""
        if kind == "leader" and not self.settings.leader_based:
            return  # no leader to crash: the other kinds' draws stay as they were
        rate = RATE_PER_HOUR[kind] * self.settings.fault_rate / 3600.0
        f = self.settings.failover_time
        fleet = self.fleet
        pending: set[asyncio.Task[None]] = set()
        try:
            while True:
                await asyncio.sleep(self.rng.expovariate(rate))
                if kind == "crash":
                    worker = self._pick()
                    if worker is not None:
                        fleet.crash(worker)
                elif kind == "leader":
                    worker = self._pick(leader=True)
                    if worker is not None:
                        fleet.crash(worker)
                elif kind == "pause":
                    worker = self._pick()
                    if worker is not None:
                        task = asyncio.create_task(
                            fleet.pause(worker, self.rng.uniform(1.5, 3.0) * f),
                            name="pause",
                        )
                        pending.add(task)
                        task.add_done_callback(pending.discard)
                elif kind == "stop":
                    worker = self._pick()
                    if worker is not None:
                        task = asyncio.create_task(fleet.graceful_stop(worker), name="stop")
                        pending.add(task)
                        task.add_done_callback(pending.discard)
                elif kind == "throttle":
                    self.events["throttle windows"] += 1
                    self.store_plan.default = store_faults(self.settings.faults, throttled=True)
                    await asyncio.sleep(self.rng.uniform(0.5, 1.5) * f)
                    self.store_plan.default = store_faults(self.settings.faults, throttled=False)
                elif kind == "reshard":
                    self.reshard()
        finally:
            # When the fault phase ends, pauses end at once; graceful stops run to completion.
            for task in pending:
                if task.get_name() == "pause":
                    task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def reshard(self) -> None:
        open_shards = sorted(
            (sh for sh in self.stream.shards if sh.is_open), key=lambda sh: sh.hash_range.start
        )
        rng = self.rng
        if len(open_shards) >= 2 and (
            rng.random() < 0.5 or len(open_shards) > 2 * self.settings.shards
        ):
            i = rng.randrange(len(open_shards) - 1)
            self.stream.merge_shards(open_shards[i].shard_id, open_shards[i + 1].shard_id)
            self.events["merges"] += 1
            return
        shard = rng.choice(open_shards)
        r = shard.hash_range
        if r.end > r.start:
            self.stream.split_shard(shard.shard_id, (r.start + r.end) // 2 + 1)
            self.events["splits"] += 1


__all__ = ["FaultInjector"]
