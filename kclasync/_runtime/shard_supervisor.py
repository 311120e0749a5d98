"""The shard supervisor: one pipeline per held lease, and what happens when one ends.

Owns: starting a ``ShardConsumer`` when the held leases say a lease is ours (in the consumer's
pipeline task group), the wait for parent shards, the child leases created before a SHARD_END
checkpoint and the ``childShardIds`` written after it, the one route by which a lost lease stops
its pipeline and reaches ``processor.lease_lost()``, the processor-failure policy, and draining
every pipeline at shutdown.
Must not: decide lease ownership or what a refused write means (``held.HeldLeases`` applies
``_core.leases.held_lease``), or which child leases to create (``_core.lineage.shard_end``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import attrs

from kclasync._adapters.protocols import ChildShard, LeaseStore, StreamClient
from kclasync._config import ConsumerConfig, ProcessorErrorPolicy
from kclasync._core.leases.held_lease import HeldLease
from kclasync._core.leases.lease import CorruptLeaseError, Lease
from kclasync._core.lineage.shard_end import (
    ChildLeasePlan,
    child_leases_at_shard_end,
    parents_finished,
)
from kclasync._processor import ProcessorFactory, RecordProcessor
from kclasync._runtime.fanout_streams import FanOutConsumers
from kclasync._runtime.held import HeldLeases
from kclasync._runtime.metrics import ConsumerMetrics
from kclasync._runtime.read_slots import ReadSlots
from kclasync._runtime.shard_consumer import ShardConsumer, ShardOutcome
from kclasync.errors import AdapterError, LeaseLostError, ProcessorFailedError
from kclasync.logging import bind_log_context

log = logging.getLogger("kclasync._consumer")


def _key_prefix(lease: Lease) -> str:
    """The stream part of a lease key ('' in single-stream mode)."""
    return lease.key[: len(lease.key) - len(lease.shard_id)]


@attrs.define(eq=False)
class _ShardRun:
    held: HeldLease
    shard: ShardConsumer
    processor: RecordProcessor
    task: asyncio.Task[None] | None = None
    lost: bool = False


class ShardSupervisor:
    """The held leases' ``LeaseListener``: runs and stops the pipelines of held leases."""

    def __init__(
        self,
        *,
        config: ConsumerConfig,
        leases: HeldLeases,
        exclude: Callable[[str, float], None],
        store: LeaseStore,
        stream_client: StreamClient,
        factory: ProcessorFactory,
        metrics: ConsumerMetrics,
        labels: tuple[str, str],
        stream_of: Callable[[str], str | None],
        on_children_created: Callable[[], None],
        on_failure: Callable[[BaseException], None],
        fanout: FanOutConsumers | None = None,
    ) -> None:
        self.config = config
        self.leases = leases
        #: Do not take a lease again for some seconds (its pipeline failed).
        self._exclude = exclude
        self.store = store
        self.client = stream_client
        self._factory = factory
        self._metrics = metrics
        self._labels = labels
        self._stream_of = stream_of
        self._on_children_created = on_children_created
        self._on_failure = on_failure
        self._fanout = fanout
        limit = config.max_reads_in_flight
        #: The worker's GetRecords calls in flight, over all its shards; renewals report their
        #: lateness to it (``observe``) and a busy loop reads less (``renewals_first``).
        self.read_slots = (
            ReadSlots(
                limit,
                failover_time=config.failover_time,
                clock=leases.now,
                adaptive=config.renewals_first,
                on_limit=metrics.reads_limit.labels(*labels).set,
            )
            if limit is not None
            else None
        )
        self._group: asyncio.TaskGroup | None = None
        self._runs: dict[str, _ShardRun] = {}
        self._releases: set[asyncio.Task[bool]] = set()
        #: Set when the consumer stops: leases that become ours are passed on, not started.
        self.stopping = False

    def attach(self, group: asyncio.TaskGroup) -> None:
        """The task group pipelines and background releases run in."""
        self._group = group

    def _spawn_release(self, key: str) -> None:
        assert self._group is not None
        task = self._group.create_task(self._release(key), name=f"release {key}")
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, key: str) -> bool:
        """Release ``key``; an unexpected error is logged, not let loose in the task group."""
        try:
            return await self.leases.release(key)
        except Exception:
            log.exception("releasing lease %s failed (it will expire)", key)
            return False

    # -- LeaseListener ---------------------------------------------------------------------

    def lease_acquired(self, held: HeldLease) -> None:
        if self.stopping:
            # A handoff to us completed while we stop: pass the lease on instead of starting.
            self._spawn_release(held.key)
            return
        stream = self._stream_of(held.key)
        if stream is None:
            log.error("lease %s is not a multi-stream lease key; releasing it", held.key)
            self._spawn_release(held.key)
            return
        assert self._group is not None
        processor = self._factory()
        shard = ShardConsumer(
            held=held,
            stream=stream,
            stream_client=self.client,
            leases=self.leases,
            processor=processor,
            config=self.config,
            metrics=self._metrics,
            labels=self._labels,
            create_children=self._create_children,
            on_shard_end=self._shard_ended,
            wait_for_parents=self._wait_for_parents,
            fanout=self._fanout,
            read_slots=self.read_slots,
        )
        run = _ShardRun(held=held, shard=shard, processor=processor)
        self._runs[held.key] = run
        run.task = self._group.create_task(self._run_shard(run), name=f"shard {held.key}")

    def lease_stop_requested(self, held: HeldLease, reason: str) -> None:
        run = self._runs.get(held.key)
        if run is not None and run.held is held:
            run.shard.request_shutdown()
        else:  # no pipeline (it failed or never started): let go right away
            self._spawn_release(held.key)

    def lease_lost(self, held: HeldLease, reason: str) -> None:
        """The one route for a lost lease: ``HeldLeases`` calls this whenever it drops one.

        The pipeline is cancelled at once, unless the loss was found by the pipeline itself
        (a refused checkpoint, a stale lease before a batch): then ``LeaseLostError`` is
        already on its way up that pipeline. Either way ``_run_shard`` tells the processor."""
        run = self._runs.get(held.key)
        if run is None or run.held is not held:
            return
        run.lost = True
        if run.task is not None and run.task is not asyncio.current_task():
            run.task.cancel()

    # -- one pipeline ----------------------------------------------------------------------

    async def _run_shard(self, run: _ShardRun) -> None:
        key = run.held.key
        bind_log_context(stream=run.shard.stream, shard=run.shard.shard_id, lease_key=key)
        try:
            outcome = await run.shard.run()
        except (asyncio.CancelledError, LeaseLostError) as exc:
            if isinstance(exc, asyncio.CancelledError) and not run.lost:
                raise
            if isinstance(exc, LeaseLostError):
                log.info("shard %s stopped: %s", key, exc)
            await self._tell_lost(run)
            return
        except ProcessorFailedError as exc:
            log.error("%s", exc)
            await self._release(key)
            if self.config.processor_error_policy is ProcessorErrorPolicy.FAIL:
                self._on_failure(exc)
            else:
                self._exclude(key, self.config.failed_shard_backoff)
            return
        except AdapterError as exc:
            # An I/O call failed after its retry budget: not a bug, so one line, no stack
            # trace. The lease is released and taken again (here or elsewhere) later.
            log.warning("shard %s stopped: %s; releasing its lease", key, exc)
            await self._release(key)
            return
        except Exception:
            log.exception("shard %s stopped with an error; releasing its lease", key)
            await self._release(key)
            self._exclude(key, self.config.failed_shard_backoff)
            return
        finally:
            if self._runs.get(key) is run:
                del self._runs[key]
        if outcome in (ShardOutcome.ENDED, ShardOutcome.SHUTDOWN):
            await self._release(key)

    async def _tell_lost(self, run: _ShardRun) -> None:
        if not run.shard.initialized:
            return
        try:
            await run.processor.lease_lost()
        except Exception:
            log.exception("processor.lease_lost raised for %s", run.held.key)

    async def drain(self) -> None:
        """Shutdown: in-flight batches finish and processors checkpoint (up to
        ``shutdown_timeout``), then every lease still held is released."""
        self.stopping = True
        runs = list(self._runs.values())
        for run in runs:
            run.shard.request_shutdown()
        tasks = [r.task for r in runs if r.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.config.shutdown_timeout)
            for task in late:
                log.warning(
                    "a shard did not shut down within %ss; cancelling it",
                    self.config.shutdown_timeout,
                )
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        # Whatever is still held (pipelines that never started) is released too.
        await asyncio.gather(*(self._release(key) for key in list(self.leases)))
        await asyncio.gather(*self._releases, return_exceptions=True)

    # -- parents and children --------------------------------------------------------------

    async def _wait_for_parents(self, held: HeldLease) -> None:
        """A child is not read until each parent lease is at SHARD_END or deleted."""
        parents = held.lease.parent_shard_ids
        prefix = _key_prefix(held.lease)
        while parents:
            leases = {}
            try:
                for parent in parents:
                    lease = await self.store.get_lease(prefix + parent)
                    if lease is not None:
                        leases[lease.key] = lease
            except AdapterError as exc:
                # Failed after its retry budget: this is a poll, so poll again later rather
                # than give the child's lease up.
                log.warning("reading the parents of %s failed: %s; polling again", held.key, exc)
            else:
                if parents_finished(held.lease, leases):
                    return
            await asyncio.sleep(self.config.parent_shard_poll_interval)

    async def _create_children(
        self, held: HeldLease, reported: tuple[ChildShard, ...]
    ) -> frozenset[str] | None:
        """One attempt, before the SHARD_END checkpoint, at the missing child leases
        (``child_leases_at_shard_end``). Returns the child shard ids once every child has a
        lease; None while a merge child waits for its other parent's lease (the shard consumer
        retries). Raises ``AdapterError`` / ``CorruptLeaseError`` for a failed read or write."""
        parent = held.lease
        kids = [c for c in reported if parent.shard_id in c.parent_shard_ids]
        if not kids:
            # No ChildShards in the response (a lease taken at SHARD_END, a trimmed shard, or
            # an emulator that omits them): ask the shard list.
            kids = await self._children_from_shard_list(parent)
        if not kids:
            log.info("shard %s ended without child shards", parent.key)
            return frozenset()
        plan = await self._plan_children(parent, kids)
        if plan.deferred:
            # Rare, so worth a full look: the shard list says whether the missing parent was
            # trimmed, and the whole table whether the merge child was read long ago.
            stream = self._stream_of(parent.key)
            assert stream is not None
            shards = await self.client.list_shards(stream)
            scan = await self.store.list_leases()
            plan = child_leases_at_shard_end(
                parent,
                shards,
                [lease for lease in scan.leases if lease.key.startswith(_key_prefix(parent))],
                listed={s.shard_id for s in shards},
            )
        created = 0
        for lease in plan.create:
            if await self.store.create_lease(lease):
                created += 1
        if created:
            log.info("shard %s ended; created %d child leases", parent.key, created)
            self._on_children_created()
        if plan.deferred:
            log.info(
                "shard %s ended; merge child %s waits for its other parent's lease before "
                "the SHARD_END checkpoint",
                parent.key,
                ", ".join(plan.deferred),
            )
            return None
        return frozenset(c.shard_id for c in kids)

    async def _children_from_shard_list(self, parent: Lease) -> list[ChildShard]:
        stream = self._stream_of(parent.key)
        assert stream is not None
        return [
            ChildShard(s.shard_id, s.parent_ids, s.hash_range)
            for s in await self.client.list_shards(stream)
            if parent.shard_id in s.parent_ids
        ]

    async def _plan_children(self, parent: Lease, kids: list[ChildShard]) -> ChildLeasePlan:
        prefix = _key_prefix(parent)
        related = {prefix + c.shard_id for c in kids}
        related |= {prefix + p for c in kids for p in c.parent_shard_ids}
        related.discard(parent.key)
        found = await asyncio.gather(*(self.store.get_lease(k) for k in sorted(related)))
        known = [lease for lease in found if lease is not None]
        return child_leases_at_shard_end(parent, kids, known)

    async def _shard_ended(self, held: HeldLease, children: frozenset[str]) -> None:
        """After the SHARD_END checkpoint: write ``childShardIds``. The lease is released by
        ``_run_shard`` afterwards. A failure here loses nothing (the children exist); the
        leader's shard sync writes them later."""
        if not children or held.lease.child_shard_ids == children:
            return
        try:
            await self.leases.write_child_shard_ids(held.key, children)
        except (AdapterError, CorruptLeaseError) as exc:
            log.warning("could not write the childShardIds of %s: %s", held.key, exc)
