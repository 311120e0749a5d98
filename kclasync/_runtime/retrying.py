"""The one place where adapter calls are retried: wrappers around every adapter protocol.

Owns: ``Retrier`` (runs one call under the policy of its operation class: bounded
exponential backoff with full jitter for ``ThrottledError`` and ``TransientError``, waits in
event-loop time, jitter from the worker's seeded ``random.Random``), and the wrapped lease
store, coordinator-state store, stream client and worker registry that ``worker.py`` builds
around the adapters and hands to every runtime part; and ``worker_retrier``, a worker's
``Retrier`` from its configuration, each retry counted in its metrics. ``through_retrier()``
tells an adapter whether the current call came through a wrapper (the tests check that every
call does).
Must not: decide budgets or delays (``kclasync._core.retry_policy``), or catch anything but
throttling and transient errors: a call that fails after its budget raises its last error to
the caller, which degrades as documented.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from kclasync._adapters.protocols import (
    CoordinatorStateStore,
    GetRecordsResult,
    LeaseScan,
    LeaseStore,
    ShardFilter,
    StartingPosition,
    StreamClient,
)
from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._config import ConsumerConfig
from kclasync._core.leases.client_version import MigrationState
from kclasync._core.leases.leader_lock import LockItem
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.lock_term import lock_interval, short_term_failover
from kclasync._core.leases.position import Checkpoint
from kclasync._core.lineage.shard import Shard
from kclasync._core.lineage.streams import StreamIdentity
from kclasync._core.retry_policy import (
    OP_CLASS,
    OpClass,
    RetryPolicy,
    give_up,
    next_delay,
    policy_table,
)
from kclasync._core.workers.worker_metrics import WorkerMetrics
from kclasync._core.workers.worker_metrics_item import DecodedEntries
from kclasync._runtime.metrics import ConsumerMetrics
from kclasync.errors import ThrottledError, TransientError, error_code

log = logging.getLogger("kclasync.retry")

T = TypeVar("T")

_THROUGH: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "kclasync_retrying", default=None
)


def through_retrier() -> str | None:
    """The operation being run by a ``Retrier`` in this task right now (None: none)."""
    return _THROUGH.get()


class Retrier:
    """Runs adapter calls under the policy table; one per worker."""

    def __init__(
        self,
        policies: Mapping[OpClass, RetryPolicy],
        rng: random.Random,
        on_retry: Callable[[str, BaseException], None] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        missing = set(OpClass) - set(policies)
        if missing:
            raise ValueError(f"no retry policy for {sorted(c.value for c in missing)}")
        self.policies = policies
        #: The policy of each operation, looked up once per operation (not per call).
        self._by_op: dict[str, RetryPolicy] = {}
        self.rng = rng
        self.on_retry = on_retry
        #: The running loop's clock (None: looked up on each call).
        self._clock = clock
        #: Calls retried, and calls given up after their budget, per operation.
        self.retried: dict[str, int] = {}
        self.exhausted: dict[str, int] = {}

    async def call(self, op: str, fn: Callable[[], Awaitable[T]]) -> T:
        policy = self._by_op.get(op)
        if policy is None:
            policy = self._by_op[op] = self.policies[OP_CLASS[op]]
        clock = self._clock or asyncio.get_running_loop().time
        start = clock()
        attempt = 0
        while True:
            attempt += 1
            token = _THROUGH.set(op)
            try:
                return await fn()
            except (ThrottledError, TransientError) as exc:
                delay = next_delay(policy, attempt, self.rng.random())
                if give_up(policy, attempt, clock() - start, delay):
                    if policy.attempts > 1:
                        self.exhausted[op] = self.exhausted.get(op, 0) + 1
                    raise
                self.retried[op] = self.retried.get(op, 0) + 1
                if self.on_retry is not None:
                    self.on_retry(op, exc)
                log.debug("%s failed (%s); attempt %d in %.3fs", op, exc, attempt + 1, delay)
            finally:
                _THROUGH.reset(token)
            await asyncio.sleep(delay)


#: The operation classes whose calls go to Kinesis (the rest go to DynamoDB).
_KINESIS_CLASSES = (OpClass.STREAM_META, OpClass.READ_RECORDS)


def lock_short_term(config: ConsumerConfig) -> float | None:
    """The failover time the leader lock's short term follows under ``config``, or None when
    the short term is off (``core.lock_term.short_term_failover``): the elector writes that
    term, and the lock's retry budget follows the pace it is written at."""
    return short_term_failover(
        config.failover_time,
        leader_based=config.lease_taker.leader_based,
        early_failover=config.early_failover,
    )


def worker_retrier(
    config: ConsumerConfig,
    metrics: ConsumerMetrics,
    labels: tuple[str, str],
    rng: random.Random,
) -> Retrier:
    """A worker's ``Retrier``: the policy table of its configuration, jitter from its seeded
    generator, and every retry counted under ``labels`` (application, worker id)."""
    policies = policy_table(
        failover_time=config.failover_time,
        renewer_interval=config.renewer_interval,
        throttle_backoff=config.throttle_backoff,
        max_backoff=config.max_backoff,
        # The lock's budget follows the pace it is written at (``core.lock_term``): a quarter
        # of the short term in a leader-based mode with early failover.
        leader_heartbeat_interval=lock_interval(
            config.leader_heartbeat_interval,
            config.leader_lock_duration,
            lock_short_term(config),
        ),
    )
    retries = metrics.retries

    def on_retry(op: str, exc: BaseException) -> None:
        service = "kinesis" if OP_CLASS[op] in _KINESIS_CLASSES else "dynamodb"
        retries.labels(*labels, "kclasync", service, op, error_code(exc)).inc()

    clock: Callable[[], float] | None = None
    with contextlib.suppress(RuntimeError):  # built inside the loop that runs it: bound once
        clock = asyncio.get_running_loop().time
    return Retrier(policies, rng, on_retry, clock)


class RetryingLeaseStore:
    """A ``LeaseStore`` whose every call goes through a ``Retrier``."""

    def __init__(self, inner: LeaseStore, retrier: Retrier) -> None:
        self.inner = inner
        self.retrier = retrier

    async def ensure_table(self) -> None:
        await self.retrier.call("ensure_table", self.inner.ensure_table)

    async def is_empty(self) -> bool:
        return await self.retrier.call("is_empty", self.inner.is_empty)

    async def list_leases(self) -> LeaseScan:
        return await self.retrier.call("list_leases", self.inner.list_leases)

    async def get_lease(self, key: str) -> Lease | None:
        return await self.retrier.call("get_lease", lambda: self.inner.get_lease(key))

    async def create_lease(self, lease: Lease) -> bool:
        return await self.retrier.call("create_lease", lambda: self.inner.create_lease(lease))

    async def renew_lease(self, lease: Lease, throughput_kbps: float | None = None) -> Lease | None:
        return await self.retrier.call(
            "renew_lease", lambda: self.inner.renew_lease(lease, throughput_kbps)
        )

    async def take_lease(self, lease: Lease, owner: str) -> Lease | None:
        return await self.retrier.call("take_lease", lambda: self.inner.take_lease(lease, owner))

    async def release_lease(self, lease: Lease) -> Lease | None:
        return await self.retrier.call("release_lease", lambda: self.inner.release_lease(lease))

    async def checkpoint(
        self, lease: Lease, checkpoint: Checkpoint, pending: Checkpoint | None = None
    ) -> Lease | None:
        return await self.retrier.call(
            "checkpoint", lambda: self.inner.checkpoint(lease, checkpoint, pending)
        )

    async def start_handoff(self, lease: Lease, new_owner: str) -> Lease | None:
        return await self.retrier.call(
            "start_handoff", lambda: self.inner.start_handoff(lease, new_owner)
        )

    async def finish_handoff(self, lease: Lease) -> Lease | None:
        return await self.retrier.call("finish_handoff", lambda: self.inner.finish_handoff(lease))

    async def lease_keys_of(self, owner: str) -> tuple[str, ...]:
        return await self.retrier.call("lease_keys_of", lambda: self.inner.lease_keys_of(owner))

    async def delete_lease(self, lease: Lease) -> bool:
        return await self.retrier.call("delete_lease", lambda: self.inner.delete_lease(lease))

    async def update_child_shard_ids(
        self, lease: Lease, child_shard_ids: frozenset[str]
    ) -> Lease | None:
        return await self.retrier.call(
            "update_child_shard_ids",
            lambda: self.inner.update_child_shard_ids(lease, child_shard_ids),
        )


class RetryingCoordinatorState:
    """A ``CoordinatorStateStore`` whose every call goes through a ``Retrier``."""

    def __init__(self, inner: CoordinatorStateStore, retrier: Retrier) -> None:
        self.inner = inner
        self.retrier = retrier

    async def ensure_table(self) -> None:
        await self.retrier.call("ensure_table", self.inner.ensure_table)

    async def get_lock(self, key: str) -> LockItem | None:
        return await self.retrier.call("get_lock", lambda: self.inner.get_lock(key))

    async def create_lock(
        self,
        key: str,
        owner: str,
        lease_duration: float,
        version: str,
        successors: tuple[str, ...] | None = None,
    ) -> LockItem | None:
        return await self.retrier.call(
            "create_lock",
            lambda: self.inner.create_lock(key, owner, lease_duration, version, successors),
        )

    async def replace_lock(
        self,
        key: str,
        expected_version: str,
        owner: str,
        lease_duration: float,
        version: str,
        successors: tuple[str, ...] | None = None,
    ) -> LockItem | None:
        return await self.retrier.call(
            "replace_lock",
            lambda: self.inner.replace_lock(
                key, expected_version, owner, lease_duration, version, successors
            ),
        )

    async def release_lock(self, key: str, expected_version: str, owner: str, version: str) -> bool:
        return await self.retrier.call(
            "release_lock",
            lambda: self.inner.release_lock(key, expected_version, owner, version),
        )

    async def get_migration_state(self) -> MigrationState | None:
        return await self.retrier.call("get_migration_state", self.inner.get_migration_state)


class RetryingStreamClient:
    """A ``StreamClient`` whose every call goes through a ``Retrier``."""

    def __init__(self, inner: StreamClient, retrier: Retrier) -> None:
        self.inner = inner
        self.retrier = retrier

    async def describe_stream(self, stream: str) -> StreamIdentity:
        return await self.retrier.call(
            "describe_stream", lambda: self.inner.describe_stream(stream)
        )

    async def list_shards(
        self, stream: str, shard_filter: ShardFilter | None = None
    ) -> list[Shard]:
        return await self.retrier.call(
            "list_shards", lambda: self.inner.list_shards(stream, shard_filter)
        )

    async def get_shard_iterator(
        self, stream: str, shard_id: str, position: StartingPosition
    ) -> str:
        return await self.retrier.call(
            "get_shard_iterator",
            lambda: self.inner.get_shard_iterator(stream, shard_id, position),
        )

    async def get_records(
        self, stream: str, shard_id: str, iterator: str, limit: int
    ) -> GetRecordsResult:
        return await self.retrier.call(
            "get_records", lambda: self.inner.get_records(stream, shard_id, iterator, limit)
        )


class RetryingWorkerRegistry:
    """A ``WorkerRegistry`` whose every call goes through a ``Retrier``."""

    def __init__(self, inner: WorkerRegistry, retrier: Retrier) -> None:
        self.inner = inner
        self.retrier = retrier

    async def ensure_table(self) -> None:
        await self.retrier.call("ensure_table", self.inner.ensure_table)

    async def report(self, metrics: WorkerMetrics) -> None:
        await self.retrier.call("report", lambda: self.inner.report(metrics))

    async def list_workers(self) -> DecodedEntries:
        return await self.retrier.call("list_workers", self.inner.list_workers)

    async def get(self, worker_id: str) -> WorkerMetrics | None:
        return await self.retrier.call("get", lambda: self.inner.get(worker_id))

    async def remove(self, worker_id: str, *, heartbeat: int | None = None) -> bool:
        return await self.retrier.call(
            "remove", lambda: self.inner.remove(worker_id, heartbeat=heartbeat)
        )


#: Every wrapper type: what runtime parts may hold instead of a bare adapter.
WRAPPERS = (
    RetryingLeaseStore,
    RetryingCoordinatorState,
    RetryingStreamClient,
    RetryingWorkerRegistry,
)

__all__ = [
    "WRAPPERS",
    "Retrier",
    "RetryingCoordinatorState",
    "RetryingLeaseStore",
    "RetryingStreamClient",
    "RetryingWorkerRegistry",
    "lock_short_term",
    "through_retrier",
    "worker_retrier",
]
