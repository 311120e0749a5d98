"""Run a fleet of real ``Consumer`` workers in virtual time, with faults, and check invariants.

Every simulated worker is an unmodified ``kclasync.Consumer`` whose ``LeaseStore`` and
``StreamClient`` are the in-memory adapters (one shared ``MemoryLeaseTable``, one shared
``MemoryStream``), wrapped only to (a) let the harness freeze the worker (a pause blocks each of
its adapter calls on entry and before the reply is handed back, and its processors mid-batch) and
(b) tell the ``InvariantChecker`` about every write the table applies. The processor records
every batch it is given. Time is the virtual time of the event loop (``clock.VirtualTimeLoop``),
so hours pass in seconds and a run depends only on the seed.

The run: workers join over the first failover period; a producer writes records at a steady rate;
the faults of ``settings.faults`` are injected for ``settings.hours`` of virtual time; then the
faults and the producer stop, paused workers resume and crashed ones have been replaced, and the
fleet runs until every record is processed and the leases are balanced (or ``settle_rounds``
taker periods pass). Then every worker is cancelled and the checker judges the run.

Owns: building the fleet, the fault injectors, the producer and the balance sampler. Must not:
re-implement any part of the runtime, read the wall clock except to report how long a run took,
or use unseeded randomness.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TypeVar

import attrs
from prometheus_client import CollectorRegistry

from kclasync._adapters.memory import (
    NO_FAULTS,
    FaultPlan,
    MemoryLeaseStore,
    MemoryLeaseTable,
    MemoryStream,
    MemoryStreamClient,
)
from kclasync._adapters.protocols import GetRecordsResult, ShardFilter, StartingPosition
from kclasync._config import ConsumerConfig
from kclasync._consumer import Consumer
from kclasync._core.balanced_taker import BalancedLeaseTaker
from kclasync._core.lease import Lease
from kclasync._core.lease_taker import Kcl2LeaseTaker, LeaseTaker
from kclasync._core.shard import Shard
from kclasync._processor import Checkpointer, ShardInfo
from kclasync._records import Record
from kclasync._simulation.faults import (
    ALL_FAULTS,
    EVENT_FAULTS,
    RATE_PER_HOUR,
    SLOW_BATCH_SHARE,
    max_store_latency,
    store_faults,
    stream_faults,
)
from kclasync._simulation.invariants import InvariantChecker
from kclasync._simulation.report import SimulationReport
from kclasync.errors import ThrottledError, TransientError

_T = TypeVar("_T")
STREAM = "sim"
APPLICATION = "sim"

#: (send time, operation) of the lease-table write being applied, set per task by
#: ``SimLeaseStore._write`` and read when the table applies it.
_SENT: contextvars.ContextVar[tuple[float, str] | None] = contextvars.ContextVar(
    "_SENT", default=None
)


def _now() -> float:
    return asyncio.get_running_loop().time()


@attrs.frozen(kw_only=True)
class SimulationSettings:
    workers: int = 8
    shards: int = 32
    #: Virtual hours during which faults are injected (the settle phase comes on top).
    hours: float = 0.25
    seed: int = 0
    faults: frozenset[str] = ALL_FAULTS
    #: Multiplies every event fault's rate (``faults.RATE_PER_HOUR``).
    fault_rate: float = 1.0
    failover_time: float = 10.0
    #: ``kcl2`` (the Java KCL 2.x rules, the default taker) or ``balanced``.
    taker: str = "kcl2"
    records_per_shard_per_minute: float = 2.0
    idle_time_between_reads: float = 2.0
    #: Processors checkpoint at most this often (and at shutdown and shard end); None: failover.
    checkpoint_interval: float | None = None
    shard_sync_interval: float = 60.0
    max_records: int = 1000
    #: After the faults stop: give up on balance and drain after this many taker periods.
    settle_rounds: int = 150

    def __attrs_post_init__(self) -> None:
        if self.workers < 1 or self.shards < 1:
            raise ValueError("workers and shards must be at least 1")
        if self.hours <= 0:
            raise ValueError("hours must be positive")
        if self.taker not in ("kcl2", "balanced"):
            raise ValueError(f"taker must be kcl2 or balanced, not {self.taker!r}")
        unknown = self.faults - ALL_FAULTS
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}")

    def consumer_config(self, worker_id: str) -> ConsumerConfig:
        f = self.failover_time
        return ConsumerConfig(
            failover_time=f,
            initial_position="TRIM_HORIZON",
            idle_time_between_reads=self.idle_time_between_reads,
            min_time_between_reads=0.2,
            max_records=self.max_records,
            processor_retry_backoff=0.5,
            shard_sync_interval=self.shard_sync_interval,
            parent_shard_poll_interval=f / 2,
            shutdown_timeout=3 * f,
            failed_shard_backoff=3 * f,
            worker_id=worker_id,
        )

    def lease_taker(self) -> LeaseTaker:
        if self.taker == "balanced":
            return BalancedLeaseTaker(steal_budget=None)
        return Kcl2LeaseTaker()


# ---------------------------------------------------------------------------------------------
# A worker and its wrapped adapters


class SimWorker:
    def __init__(self, sim: Simulation, name: str) -> None:
        self.sim = sim
        self.name = name
        self.running = asyncio.Event()
        self.running.set()
        self.consumer: Consumer | None = None
        self.task: asyncio.Task[None] | None = None
        self.alive = True
        self.stopping = False

    @property
    def paused(self) -> bool:
        return not self.running.is_set()

    async def gate(self) -> None:
        """Blocks while the worker is paused."""
        if not self.running.is_set():
            await self.running.wait()

    def make_processor(self) -> SimProcessor:
        return SimProcessor(self)


class SimLeaseStore(MemoryLeaseStore):
    """A worker's view of the shared table: gated by its pause, and observed by the checker."""

    def __init__(self, table: MemoryLeaseTable, faults: FaultPlan, worker: SimWorker) -> None:
        super().__init__(table, faults=faults)
        self.worker = worker

    async def _read(self, op: str, apply: Callable[[], _T]) -> _T:
        await self.worker.gate()
        result = await super()._read(op, apply)
        await self.worker.gate()
        return result

    async def _write(self, op: str, apply: Callable[[], _T]) -> _T:
        token = _SENT.set((_now(), op))
        try:
            await self.worker.gate()
            result = await super()._write(op, apply)
        finally:
            _SENT.reset(token)
        await self.worker.gate()
        return result

    def _store(self, lease: Lease) -> Lease:
        old = self.table.leases.get(lease.key)
        stored = super()._store(lease)
        sent = _SENT.get()
        self.worker.sim.checker.lease_written(
            old,
            stored,
            op=sent[1] if sent is not None else "unknown",
            writer=self.worker.name,
            now=_now(),
            writer_sent=sent[0] if sent is not None else None,
        )
        return stored

    async def delete_lease(self, lease: Lease) -> bool:
        deleted = await super().delete_lease(lease)
        if deleted:
            self.worker.sim.checker.lease_deleted(lease.key, _now())
        return deleted


class SimStreamClient(MemoryStreamClient):
    def __init__(self, stream: MemoryStream, faults: FaultPlan, worker: SimWorker) -> None:
        super().__init__([stream], faults=faults)
        self.worker = worker

    async def list_shards(
        self, stream: str, shard_filter: ShardFilter | None = None
    ) -> list[Shard]:
        await self.worker.gate()
        result = await super().list_shards(stream, shard_filter)
        await self.worker.gate()
        return result

    async def get_shard_iterator(
        self, stream: str, shard_id: str, position: StartingPosition
    ) -> str:
        await self.worker.gate()
        result = await super().get_shard_iterator(stream, shard_id, position)
        await self.worker.gate()
        return result

    async def get_records(
        self, stream: str, shard_id: str, iterator: str, limit: int
    ) -> GetRecordsResult:
        await self.worker.gate()
        result = await super().get_records(stream, shard_id, iterator, limit)
        await self.worker.gate()
        return result


class SimProcessor:
    """Records each batch with the checker, takes simulated time, checkpoints periodically."""

    def __init__(self, worker: SimWorker) -> None:
        self.worker = worker
        self.sim = worker.sim
        self.shard_id = ""
        self.last_checkpoint_at = 0.0

    async def initialize(self, shard: ShardInfo) -> None:
        self.shard_id = shard.shard_id
        self.last_checkpoint_at = _now()

    async def process_records(
        self,
        records: Sequence[Record],
        checkpointer: Checkpointer,
        millis_behind_latest: int | None,
    ) -> None:
        sim = self.sim
        call = sim.checker.call_started(
            self.worker.name,
            self.shard_id,
            records[0].sequence_number,
            records[-1].sequence_number,
            len(records),
            _now(),
        )
        completed = False
        try:
            await asyncio.sleep(sim.batch_time(len(records)))
            await self.worker.gate()  # a pause freezes the batch in the middle
            completed = True
        finally:
            sim.checker.call_ended(call, _now(), completed=completed)
        if _now() - self.last_checkpoint_at >= sim.checkpoint_interval:
            try:
                await checkpointer.checkpoint()
                self.last_checkpoint_at = _now()
            except (ThrottledError, TransientError):
                pass  # the next batch checkpoints; the records are safe until then

    async def lease_lost(self) -> None:
        return None

    async def _retrying(self, write: Callable[[], object]) -> None:
        delay = 0.2
        for _ in range(8):
            try:
                await write()  # type: ignore[misc]
                return
            except (ThrottledError, TransientError):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        await write()  # type: ignore[misc]

    async def shard_ended(self, checkpointer: Checkpointer) -> None:
        await self.worker.gate()
        await self._retrying(checkpointer.checkpoint_shard_end)

    async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        delivered = checkpointer.last_delivered
        if delivered is not None and delivered != checkpointer.last_checkpoint:
            await self._retrying(checkpointer.checkpoint)


class _ErrorCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[f"{record.name}: {record.msg}"] += 1


# ---------------------------------------------------------------------------------------------
# The simulation


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
        self.registry = CollectorRegistry()
        self.taker = settings.lease_taker()
        self.checkpoint_interval = (
            s.checkpoint_interval if s.checkpoint_interval is not None else s.failover_time
        )
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
        self.workers: list[SimWorker] = []
        self.faults_active = False
        self.producing = False
        self.produced = 0
        self.events: Counter[str] = Counter()
        self.startup_failures = 0
        self._background: list[asyncio.Task[None]] = []
        self._restarts: set[asyncio.Task[None]] = set()
        self.faults_end = 0.0
        self.balanced_at: float | None = None
        self.lease_samples: list[int] = []

    # -- helpers ---------------------------------------------------------------------------

    def batch_time(self, records: int) -> float:
        if (
            self.faults_active
            and "slow" in self.settings.faults
            and self.rng_work.random() < SLOW_BATCH_SHARE
        ):
            self.events["slow batches"] += 1
            return self.rng_work.uniform(0.3, 1.5) * self.settings.failover_time
        return 0.01 + 0.001 * records

    def live_workers(self) -> list[SimWorker]:
        return [w for w in self.workers if w.alive and not w.stopping]

    def _owned_by(self, name: str) -> list[str]:
        return sorted(k for k, lease in self.table.leases.items() if lease.owner == name)

    # -- workers ---------------------------------------------------------------------------

    def start_worker(self) -> SimWorker:
        s = self.settings
        name = f"w{len(self.workers):04d}"
        worker = SimWorker(self, name)
        worker.consumer = Consumer(
            stream_name=STREAM,
            application_name=APPLICATION,
            processor=worker.make_processor,
            config=s.consumer_config(name),
            registry=self.registry,
            lease_store=SimLeaseStore(self.table, self.store_plan, worker),
            stream_client=SimStreamClient(self.stream, self.stream_plan, worker),
            lease_taker=self.taker,
            rng=random.Random(self.rng_workers.getrandbits(64)),
        )
        self.workers.append(worker)
        worker.task = asyncio.create_task(self._run_worker(worker), name=f"worker {name}")
        return worker

    async def _run_worker(self, worker: SimWorker) -> None:
        assert worker.consumer is not None
        try:
            await worker.consumer.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # run() ended with an error (e.g. a failed first shard sync): like a process that
            # exits, it is replaced.
            worker.alive = False
            self.startup_failures += 1
            self.events[f"worker exited: {type(exc).__name__}"] += 1
            self._later(self.settings.failover_time, self.start_worker)
            return
        worker.alive = False

    def _later(self, delay: float, action: Callable[[], object]) -> None:
        async def run() -> None:
            await asyncio.sleep(delay)
            action()

        task = asyncio.create_task(run())
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    def crash(self, worker: SimWorker) -> None:
        assert worker.task is not None
        self.events["crashes"] += 1
        worker.alive = False
        self.checker.worker_failed(worker.name, self._owned_by(worker.name), _now())
        worker.task.cancel()
        f = self.settings.failover_time
        self._later(self.rng_faults.uniform(0.5, 2.0) * f, self.start_worker)

    async def graceful_stop(self, worker: SimWorker) -> None:
        assert worker.consumer is not None and worker.task is not None
        self.events["graceful stops"] += 1
        worker.stopping = True
        limit = worker.consumer.config.shutdown_timeout + 3 * self.settings.failover_time
        try:
            await asyncio.wait_for(worker.consumer.stop(), limit)
        except TimeoutError:
            self.checker.violate(
                "stop_hung", _now(), f"{worker.name}: stop() did not return within {limit}s"
            )
            worker.task.cancel()
        await asyncio.gather(worker.task, return_exceptions=True)
        worker.alive = False
        self.start_worker()

    async def pause(self, worker: SimWorker, seconds: float) -> None:
        self.events["pauses"] += 1
        worker.running.clear()
        self.checker.paused(worker.name, _now())
        self.checker.worker_failed(worker.name, self._owned_by(worker.name), _now())
        try:
            await asyncio.sleep(seconds)
        finally:
            worker.running.set()
            self.checker.resumed(worker.name, _now())
            self.checker.worker_back(worker.name)

    # -- fault injectors -------------------------------------------------------------------

    def _pick(self, *, allow_paused: bool = False) -> SimWorker | None:
        candidates = [w for w in self.live_workers() if allow_paused or not w.paused]
        troubled = self.settings.workers - len(candidates)
        if len(candidates) <= 1 or troubled >= max(1, self.settings.workers // 3):
            return None
        return self.rng_faults.choice(candidates)

    async def _inject(self, kind: str) -> None:
        rate = RATE_PER_HOUR[kind] * self.settings.fault_rate / 3600.0
        f = self.settings.failover_time
        pending: set[asyncio.Task[None]] = set()
        try:
            while True:
                await asyncio.sleep(self.rng_faults.expovariate(rate))
                if kind == "crash":
                    worker = self._pick()
                    if worker is not None:
                        self.crash(worker)
                elif kind == "pause":
                    worker = self._pick()
                    if worker is not None:
                        task = asyncio.create_task(
                            self.pause(worker, self.rng_faults.uniform(1.5, 3.0) * f),
                            name="pause",
                        )
                        pending.add(task)
                        task.add_done_callback(pending.discard)
                elif kind == "stop":
                    worker = self._pick()
                    if worker is not None:
                        task = asyncio.create_task(self.graceful_stop(worker), name="stop")
                        pending.add(task)
                        task.add_done_callback(pending.discard)
                elif kind == "throttle":
                    self.events["throttle windows"] += 1
                    self.store_plan.default = store_faults(self.settings.faults, throttled=True)
                    await asyncio.sleep(self.rng_faults.uniform(0.5, 1.5) * f)
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
        rng = self.rng_faults
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

    # -- balance ---------------------------------------------------------------------------

    def balance(self) -> tuple[bool, int, int, int]:
        """(balanced, orphaned leases, min held, max held) over live, unpaused workers."""
        live = {w.name: 0 for w in self.live_workers() if not w.paused}
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
        start = _now()
        self.producing = True
        self.faults_active = True
        producer = asyncio.create_task(self._produce())
        for _ in range(s.workers):
            self._later(self.rng_workers.uniform(0, f), self.start_worker)
        injectors = [
            asyncio.create_task(self._inject(kind), name=f"inject {kind}")
            for kind in EVENT_FAULTS
            if kind in s.faults
        ]
        await asyncio.sleep(s.hours * 3600.0)

        # Faults stop: no new events, table and stream calls behave, producer stops.
        self.faults_end = _now()
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
                self.balanced_at = _now()
            elif not balanced:
                self.balanced_at = None
            if self.balanced_at is not None and self.drained() and not self._restarts:
                break
        end = _now()
        balanced, orphans, low, high = self.balance()
        if not balanced:
            self.checker.violate(
                "not_balanced",
                end,
                f"{rounds} taker rounds after the faults stopped: {orphans} leases not held "
                f"by a live worker, held per worker {low}..{high}",
            )
        for worker in self.workers:
            if worker.task is not None:
                worker.task.cancel()
        for task in list(self._restarts):
            task.cancel()
        await asyncio.gather(
            *(w.task for w in self.workers if w.task is not None),
            *self._restarts,
            return_exceptions=True,
        )
        self.checker.finish(now=_now(), shards=[sh.shard_id for sh in self.stream.shards])
        wall = time.perf_counter() - wall_start
        return SimulationReport.build(
            self, start=start, end=end, wall_seconds=wall, errors=errors.counts
        )


def run_simulation(
    settings: SimulationSettings, *, wall_limit: float | None = None
) -> SimulationReport:
    """Run one simulation on a fresh virtual-time loop (``wall_limit``: see ``run_virtual``)."""
    from kclasync._simulation.clock import run_virtual

    return run_virtual(lambda: Simulation(settings).run(), wall_limit=wall_limit)


__all__ = [
    "SimLeaseStore",
    "SimProcessor",
    "SimStreamClient",
    "SimWorker",
    "Simulation",
    "SimulationSettings",
    "run_simulation",
]
