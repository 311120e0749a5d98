"""A fleet of in-process workers for the fault and limit tests, and what they must keep.

``Journal`` records every batch (worker, shard, sequence range, loop times), every checkpoint
written and every lease lost, through ``JournalProcessor`` (a full-contract processor that
checkpoints after each batch). ``LeaseWatch`` samples the lease table (through an unfaulted
client) and the workers' held-lease views. From them:

* ``two_owner_violations``: a shard whose batches by two workers overlap in time, or whose
  worker changes back and forth (A, B, A) while B kept processing it: two live owners;
* ``duplicate_causes``: each record processed more than once, by cause: ``checkpoint_failed``
  (its batch's checkpoint failed, so the processor raised and the batch was delivered again),
  ``lease_moved`` (processed by two workers), or ``same_worker`` (again by its owner, for no
  reason known here);
* ``LeaseWatch.moves``: lease-table owner changes; ``LeaseWatch.view_overlaps``: samples where
  a lease was in two workers' held views at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import attrs
import orjson
from prometheus_client import CollectorRegistry

from kclasync import Consumer
from kclasync._adapters.aws import ClientOptions
from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync._processor import Checkpointer, ShardInfo
from kclasync._records import Record
from kclasync.testing.emulators import LocalAws
from tests.support import fast_config


@attrs.frozen
class Batch:
    worker: str
    shard: str
    first: int
    last: int
    start: float
    end: float


class Journal:
    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.checkpoints: list[tuple[float, str, str, int]] = []
        self.lost: list[tuple[float, str, str]] = []
        self.deliveries: dict[int, list[str]] = defaultdict(list)
        #: Records of the batches whose checkpoint failed (the processor raised).
        self.unconfirmed: set[int] = set()

    def processor(self, worker: str) -> Callable[[], JournalProcessor]:
        return lambda: JournalProcessor(self, worker)

    def seen(self, ids: Sequence[int] | set[int]) -> bool:
        return all(i in self.deliveries for i in ids)

    def two_owner_violations(self) -> list[str]:
        found: list[str] = []
        by_shard: dict[str, list[Batch]] = defaultdict(list)
        for b in self.batches:
            by_shard[b.shard].append(b)
        for shard, batches in by_shard.items():
            batches.sort(key=lambda b: b.start)
            for a, b in itertools.pairwise(batches):
                if a.worker != b.worker and b.start < a.end:
                    found.append(f"{shard}: {a.worker} and {b.worker} overlap at {b.start:.2f}")
            runs = [b.worker for b in batches]
            owners = [w for i, w in enumerate(runs) if i == 0 or runs[i - 1] != w]
            for i in range(len(owners) - 2):
                if owners[i] == owners[i + 2]:
                    back = owners[i]
                    # A, B, A: fine if the lease went back (B stopped); not if B goes on later.
                    later = owners[i + 3 :] if i + 3 < len(owners) else []
                    if owners[i + 1] in later:
                        found.append(f"{shard}: owners alternate {owners[i : i + 4]} ({back})")
        return found

    def duplicate_causes(self) -> Counter[str]:
        causes: Counter[str] = Counter()
        for rid, workers in self.deliveries.items():
            if len(workers) > 1:
                if len(set(workers)) > 1:
                    cause = "lease_moved"
                elif rid in self.unconfirmed:
                    cause = "checkpoint_failed"
                else:
                    cause = "same_worker"
                causes[cause] += len(workers) - 1
        return causes


class JournalProcessor:
    def __init__(self, journal: Journal, worker: str) -> None:
        self.journal = journal
        self.worker = worker
        self.shard = ""

    async def initialize(self, shard: ShardInfo) -> None:
        self.shard = shard.shard_id

    async def process_records(
        self,
        records: Sequence[Record],
        checkpointer: Checkpointer,
        millis_behind_latest: int | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for r in records:
            self.journal.deliveries[int(orjson.loads(r.data)["id"])].append(self.worker)
        try:
            await checkpointer.checkpoint()
        except Exception:
            # The batch is delivered again (the processor's retry): duplicates by this cause.
            self.journal.unconfirmed.update(int(orjson.loads(r.data)["id"]) for r in records)
            raise
        end = loop.time()
        first, last = int(records[0].sequence_number), int(records[-1].sequence_number)
        self.journal.batches.append(Batch(self.worker, self.shard, first, last, start, end))
        self.journal.checkpoints.append((end, self.worker, self.shard, last))

    async def lease_lost(self) -> None:
        self.journal.lost.append((asyncio.get_running_loop().time(), self.worker, self.shard))

    async def shard_ended(self, checkpointer: Checkpointer) -> None:
        await checkpointer.checkpoint_shard_end()

    async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        await checkpointer.checkpoint()


class LeaseWatch:
    """Samples the lease table's owners and the workers' views every ``every`` seconds."""

    def __init__(self, store: DynamoLeaseStore, workers: Sequence[Consumer]) -> None:
        self.store = store
        self.workers = workers
        self.owners: dict[str, str | None] = {}
        self.moves: list[tuple[float, str, str | None, str | None]] = []
        self.view_overlaps: list[tuple[float, str, list[str]]] = []
        self.counting = False
        # The first scan begun after ``counting`` was set is the baseline: the scan before it
        # may predate the last moves of the warm-up, which are not the fault phases' moves.
        self._baseline_taken = False

    async def run(self, every: float = 0.25) -> None:
        loop = asyncio.get_running_loop()
        while True:
            armed = self.counting
            views: dict[str, list[str]] = defaultdict(list)
            for w in self.workers:
                for key in w.held_leases:
                    views[key].append(w.worker_id)
            for key, holders in views.items():
                if len(holders) > 1 and self.counting:
                    self.view_overlaps.append((loop.time(), key, holders))
            with contextlib.suppress(Exception):  # the watch must never stop the test
                scan = await self.store.list_leases()
                for lease in scan.leases:
                    before = self.owners.get(lease.key)
                    # A move: from one owner to another or to none (a lease released); the
                    # first owner of an unowned lease is no move.
                    moved = before is not None and before != lease.owner
                    if armed and self._baseline_taken and moved:
                        self.moves.append((loop.time(), lease.key, before, lease.owner))
                    self.owners[lease.key] = lease.owner
                if armed:
                    self._baseline_taken = True
            await asyncio.sleep(every)


def botocore_options(url: str, **overrides: Any) -> ClientOptions:
    """Client options that reach ``url`` through botocore's own request path (where the
    options still offer another path, it is turned off)."""
    if "fast_requests" in attrs.fields_dict(ClientOptions):
        overrides.setdefault("fast_requests", False)
    return LocalAws(url).client_options(**overrides)


@contextlib.asynccontextmanager
async def running(
    options: ClientOptions,
    name: str,
    journal: Journal,
    workers: int,
    registry: CollectorRegistry,
    **config: Any,
) -> AsyncIterator[list[Consumer]]:
    """``workers`` consumers of stream ``name`` (application ``name``), started; stopped on
    exit."""
    fleet = [
        Consumer(
            stream_name=name,
            application_name=name,
            processor=journal.processor(f"w{i}"),
            config=fast_config(worker_id=f"w{i}", **config),
            client_options=options,
            registry=registry,
        )
        for i in range(workers)
    ]
    tasks = [asyncio.create_task(c.run()) for c in fleet]
    try:
        yield fleet
    finally:
        for c, t in zip(fleet, tasks, strict=True):
            if not t.done():
                await c.stop()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, f"workers failed: {errors!r}"


def totals(registry: CollectorRegistry, metric: str, *by: str) -> Counter[tuple[str, ...]]:
    """A counter's samples summed by the labels ``by``."""
    out: Counter[tuple[str, ...]] = Counter()
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == metric:
                out[tuple(sample.labels.get(k, "") for k in by)] += int(sample.value)
    return out
