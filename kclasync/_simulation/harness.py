"""Run a fleet of real ``Consumer`` workers in virtual time, with faults, and check invariants.

Every simulated worker is an unmodified ``kclasync.Consumer`` whose ``LeaseStore`` and
``StreamClient`` are the in-memory adapters (one shared ``MemoryLeaseTable``, one shared
``MemoryStream``), wrapped only to (a) let the harness freeze the worker and (b) tell the
``InvariantChecker`` about every write the table applies (see ``worker``). Time is the virtual
time of the event loop (``clock.VirtualTimeLoop``), so hours pass in seconds and a run depends
only on the seed.

The run: workers join over the first failover period; a producer writes records at a steady rate;
the faults of ``settings.faults`` are injected (``injectors``) for ``settings.hours`` of virtual
time; then the faults and the producer stop, paused workers resume and crashed ones have been
replaced (``fleet``), and the fleet runs until every record is processed and the leases are
balanced (or ``settle_rounds`` taker periods pass). Then every worker is cancelled and the checker
judges the run.

Owns: ``Simulation`` (the seeded random streams, the shared table and stream, the producer, the
balance sampler and the phases of a run) and ``run_simulation``. Must not: re-implement any part
of the runtime, read the wall clock except to report how long a run took, or use unseeded
randomness.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
from collections import Counter
from typing import TYPE_CHECKING

from kclasync._adapters.memory import NO_FAULTS, FaultPlan, MemoryLeaseTable, MemoryStream
from kclasync._simulation.faults import (
    EVENT_FAULTS,
    SLOW_BATCH_SHARE,
    max_store_latency,
    store_faults,
    stream_faults,
)
from kclasync._simulation.fleet import Fleet
from kclasync._simulation.injectors import FaultInjector
from kclasync._simulation.invariants import InvariantChecker
from kclasync._simulation.report import SimulationReport
from kclasync._simulation.settings import STREAM, SimulationSettings
from kclasync._simulation.worker import SimWorker, now

if TYPE_CHECKING:
    from kclasync._observations import RecordingWriter
    from kclasync._simulation.recording import SimulationRecorder


#: Allocations between young garbage collections while a simulation runs (Python's default is
#: 700). A fleet allocates millions of short-lived objects (futures, timer handles, leases) and
#: keeps most of what survives; at the default a tenth of the run's CPU went to collections
#: that found little. The older generations' thresholds are left as they are.
_GC_YOUNG_THRESHOLD = 50_000


class _ErrorCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[f"{record.name}: {record.msg}"] += 1


class Simulation:
    def __init__(self, settings: SimulationSettings) -> None:
        self.settings = s = settings
        master = random.Random(settings.seed)
        self.rng_faults = random.Random(master.getrandbits(64))
        self.rng_work = random.Random(master.getrandbits(64))
        self.rng_producer = random.Random(master.getrandbits(64))
        self.rng_workers = random.Random(master.getrandbits(64))
        kinds = settings.faults
        self.store_plan = FaultPlan(
            random.Random(master.getrandbits(64)), default=store_faults(kinds, throttled=False)
        )
        self.stream_plan = FaultPlan(
            random.Random(master.getrandbits(64)), default=stream_faults(kinds)
        )
        self.table = MemoryLeaseTable()
        self.stream = MemoryStream(STREAM, settings.shards)
        self.checkpoint_interval = (
            s.checkpoint_interval if s.checkpoint_interval is not None else s.failover_time
        )
        self.buffered_checkpoints = s.buffered_checkpoints
        sample = s.consumer_config("sample")
        self.taker_interval = sample.taker_interval
        self.checker = InvariantChecker(
            failover_time=s.failover_time,
            notice_slack=sample.renewer_interval + 3 * max_store_latency(kinds),
            record_count=self.stream.record_count,
            record_index=self.stream.record_index,
            parents_of=lambda shard: self.stream.shard(shard).parent_ids,
            shard_closed=lambda shard: not self.stream.shard(shard).is_open,
            lease_of=self.table.get,
        )
        self.events: Counter[str] = Counter()
        self.fleet = Fleet(
            self,
            s,
            table=self.table,
            stream=self.stream,
            store_plan=self.store_plan,
            stream_plan=self.stream_plan,
            rng_workers=self.rng_workers,
            rng_faults=self.rng_faults,
            events=self.events,
        )
        self.injector = FaultInjector(
            self.fleet,
            s,
            rng=self.rng_faults,
            store_plan=self.store_plan,
            stream=self.stream,
            events=self.events,
        )
        self.faults_active = False
        self.producing = False
        self.produced = 0
        self.faults_end = 0.0
        self.balanced_at: float | None = None
        self.lease_samples: list[int] = []
        #: Writes what the run looks like to a dashboard (``simulate --record``), or None.
        self.recorder: SimulationRecorder | None = None

    @property
    def workers(self) -> list[SimWorker]:
        return self.fleet.workers

    def batch_time(self, records: int) -> float:
        if (
            self.faults_active
            and "slow" in self.settings.faults
            and self.rng_work.random() < SLOW_BATCH_SHARE
        ):
            self.events["slow batches"] += 1
            return self.rng_work.uniform(0.3, 1.5) * self.settings.failover_time
        return 0.01 + 0.001 * records

    async def _produce(self) -> None:
        s = self.settings
        per_second = s.records_per_shard_per_minute * s.shards / 60.0
        carry = 0.0
        rng = self.rng_producer
        while self.producing:
            carry += per_second
            count = int(carry)
            carry -= count
            for _ in range(count):
                n = self.produced
                self.stream.put_record(f"pk-{n}", b"%d" % n, explicit_hash_key=rng.getrandbits(128))
                self.produced += 1
            await asyncio.sleep(1.0)

    def balance(self) -> tuple[bool, int, int, int]:
        """(balanced, orphaned leases, min held, max held) over live, unpaused workers."""
        live = {w.name: 0 for w in self.fleet.live_workers() if not w.paused}
        orphans = 0
        unfinished = 0
        for lease in self.table.leases.values():
            if lease.is_finished:
                continue
            unfinished += 1
            if lease.owner in live:
                live[lease.owner] += 1
            else:
                orphans += 1
        self.lease_samples.append(len(self.table.leases))
        if not live:
            return False, orphans, 0, 0
        low, high = min(live.values()), max(live.values())
        if self.settings.leader_based:
            # The leader balances throughput or CPU, not counts (and the KCL 3.x decider counts
            # a lease without throughput as 0): only ownership is checked.
            return orphans == 0, orphans, low, high
        return orphans == 0 and high - low <= 1, orphans, low, high

    def drained(self) -> bool:
        return self.checker_processed() >= self.total_records()

    def total_records(self) -> int:
        return sum(self.stream.record_count(sh.shard_id) for sh in self.stream.shards)

    def checker_processed(self) -> int:
        return self.checker.unique_processed()

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> SimulationReport:
        wall_start = time.perf_counter()
        logger = logging.getLogger("kclasync")
        counter = _ErrorCounter()
        saved = (logger.level, logger.propagate)
        logger.setLevel(logging.ERROR)
        logger.propagate = False
        logger.addHandler(counter)
        try:
            return await self._run(wall_start, counter)
        finally:
            logger.removeHandler(counter)
            logger.setLevel(saved[0])
            logger.propagate = saved[1]

    async def _run(self, wall_start: float, errors: _ErrorCounter) -> SimulationReport:
        s = self.settings
        f = s.failover_time
        start = now()
        self.producing = True
        self.faults_active = True
        producer = asyncio.create_task(self._produce())
        recording = None
        if self.recorder is not None:
            recording = asyncio.create_task(self.recorder.run(), name="record")
        for _ in range(s.workers):
            self.fleet.later(self.rng_workers.uniform(0, f), self.fleet.start_worker)
        injectors = [
            asyncio.create_task(self.injector.inject(kind), name=f"inject {kind}")
            for kind in EVENT_FAULTS
            if kind in s.faults
        ]
        await asyncio.sleep(s.hours * 3600.0)

        # Faults stop: no new events, table and stream calls behave, producer stops.
        self.faults_end = now()
        self.faults_active = False
        for task in injectors:
            task.cancel()
        await asyncio.gather(*injectors, return_exceptions=True)
        self.store_plan.default = NO_FAULTS
        self.stream_plan.default = NO_FAULTS
        self.producing = False
        await producer

        rounds = 0
        while rounds < s.settle_rounds:
            await asyncio.sleep(self.taker_interval)
            rounds += 1
            balanced, _, _, _ = self.balance()
            if balanced and self.balanced_at is None:
                self.balanced_at = now()
            elif not balanced:
                self.balanced_at = None
            if self.balanced_at is not None and self.drained() and not self.fleet.restarts:
                break
        end = now()
        balanced, orphans, low, high = self.balance()
        if not balanced:
            self.checker.violate(
                "not_balanced",
                end,
                f"{rounds} taker rounds after the faults stopped: {orphans} leases not held "
                f"by a live worker, held per worker {low}..{high}",
            )
        if recording is not None:
            recording.cancel()
            await asyncio.gather(recording, return_exceptions=True)
        await self.fleet.cancel_all()
        self.checker.finish(now=now(), shards=[sh.shard_id for sh in self.stream.shards])
        wall = time.perf_counter() - wall_start
        return SimulationReport.build(
            self, start=start, end=end, wall_seconds=wall, errors=errors.counts
        )


def run_simulation(
    settings: SimulationSettings,
    *,
    wall_limit: float | None = None,
    record: RecordingWriter | None = None,
) -> SimulationReport:
    """Run one simulation on a fresh virtual-time loop (``wall_limit``: see ``run_virtual``);
    ``record``: write its observations there, as ``kclasync dashboard --record`` does."""
    from kclasync._simulation.clock import run_virtual

    def build() -> Simulation:
        simulation = Simulation(settings)
        if record is not None:
            from kclasync._simulation.recording import SimulationRecorder

            simulation.recorder = SimulationRecorder(
                record, simulation.table, simulation.fleet.registry
            )
        return simulation

    saved = gc.get_threshold()
    gc.set_threshold(_GC_YOUNG_THRESHOLD, *saved[1:])
    try:
        return run_virtual(lambda: build().run(), wall_limit=wall_limit)
    finally:
        gc.set_threshold(*saved)


__all__ = ["Simulation", "run_simulation"]
