"""What one worker is made of: its runtime parts, built on given adapters and wired together.

Owns: ``WorkerSpec`` (what a ``Consumer`` was built with), the retry wrappers every adapter call
goes through (one policy table per worker), and building the parts on them: lease coordinator,
early failover, leader elector, shard sync, leader duties, fan-out consumers, shard supervisor,
and in the leader-based modes the leader's assignment loop and this worker's discovery.
Must not: start tasks, run anything, make protocol decisions, or create AWS clients (``Consumer``
does); running the parts and the order of a stop are ``worker``'s.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import attrs

from kclasync._adapters.cpu_metrics import CpuReader
from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.protocols import CoordinatorStateStore, LeaseStore, StreamClient
from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._config import ConsumerConfig, RetrievalMode
from kclasync._core.expiry import ExpiryTracker
from kclasync._core.fanout_session import ResubscribePolicy
from kclasync._core.lease_taker import LeaseTaker
from kclasync._core.retry_policy import OP_CLASS, OpClass, policy_table
from kclasync._processor import ProcessorFactory
from kclasync._runtime.assignment import AssignmentDiscovery, LeaderAssignment, assignment_tasks
from kclasync._runtime.early_failover import EarlyFailover
from kclasync._runtime.fanout_streams import FanOutConsumers
from kclasync._runtime.leader import LeaderElector
from kclasync._runtime.leader_duties import LeaderDuties
from kclasync._runtime.lease_coordinator import HeldLease, LeaseCoordinator
from kclasync._runtime.metrics import ConsumerMetrics
from kclasync._runtime.retrying import (
    Retrier,
    RetryingCoordinatorState,
    RetryingLeaseStore,
    RetryingStreamClient,
    RetryingWorkerRegistry,
)
from kclasync._runtime.shard_supervisor import ShardSupervisor
from kclasync._runtime.shard_sync import ShardSync, StreamList
from kclasync.errors import ConfigError, error_code


@attrs.frozen
class WorkerSpec:
    """What a ``Consumer`` was built with, as its worker needs it."""

    config: ConsumerConfig
    worker_id: str
    application: str
    streams: StreamList
    multi_stream: bool
    factory: ProcessorFactory
    taker: LeaseTaker
    rng: random.Random
    metrics: ConsumerMetrics


def retrier_for(spec: WorkerSpec) -> Retrier:
    """The retry policy table of a worker, with jitter from its seeded generator."""
    cfg = spec.config
    policies = policy_table(
        failover_time=cfg.failover_time,
        renewer_interval=cfg.renewer_interval,
        throttle_backoff=cfg.throttle_backoff,
        max_backoff=cfg.max_backoff,
        leader_heartbeat_interval=cfg.leader_heartbeat_interval,
    )
    retries = spec.metrics.retries

    def on_retry(op: str, exc: BaseException) -> None:
        service = "kinesis" if OP_CLASS[op] in _KINESIS_CLASSES else "dynamodb"
        retries.labels(
            spec.application, spec.worker_id, "kclasync", service, op, error_code(exc)
        ).inc()

    return Retrier(policies, spec.rng, on_retry)


_KINESIS_CLASSES = (OpClass.STREAM_META, OpClass.READ_RECORDS)


def shard_sync_for(
    spec: WorkerSpec,
    store: LeaseStore,
    client: StreamClient,
    coordinator: LeaseCoordinator | None,
    on_created: Callable[[], None],
) -> ShardSync:
    """The shard sync of a worker (with no coordinator: a one-off sync, e.g. a table set-up)."""

    def loop_time() -> float:
        return asyncio.get_running_loop().time()

    if not isinstance(store, RetryingLeaseStore):  # a one-off sync outside a worker
        retrier = retrier_for(spec)
        store = RetryingLeaseStore(store, retrier)
        client = RetryingStreamClient(client, retrier)

    return ShardSync(
        config=spec.config,
        streams=spec.streams,
        multi_stream=spec.multi_stream,
        store=store,
        stream_client=client,
        clock=coordinator.now if coordinator is not None else loop_time,
        expiry=(
            coordinator.taking.expiry
            if coordinator is not None
            else ExpiryTracker(spec.config.failover_time)
        ),
        on_created=on_created,
    )


def fanout_consumers_for(spec: WorkerSpec, client: FanOutClient | None) -> FanOutConsumers | None:
    """The worker's stream consumers when it reads with enhanced fan-out (else None)."""
    cfg = spec.config
    if cfg.retrieval is not RetrievalMode.FANOUT:
        return None
    if client is None:
        raise ConfigError(
            "retrieval", "fan-out needs the Kinesis client kclasync creates (no stream_client=)"
        )
    return FanOutConsumers(
        client,
        cfg.fanout_consumer_name or spec.application,
        policy=ResubscribePolicy(refresh_after=cfg.fanout_refresh_after),
        rng=spec.rng,
        activation_timeout=cfg.fanout_activation_timeout,
        deregister_on_stop=cfg.fanout_deregister_on_stop,
    )


class _NotListening:
    """The coordinator's listener until the supervisor is attached (nothing is held yet)."""

    def lease_acquired(self, held: HeldLease) -> None:
        raise AssertionError(f"lease {held.key} acquired before the supervisor was attached")

    def lease_lost(self, held: HeldLease, reason: str) -> None:
        return None

    def lease_stop_requested(self, held: HeldLease, reason: str) -> None:
        return None


@attrs.frozen
class WorkerParts:
    """The parts of one worker, on adapters wrapped in its retry policy table."""

    retrier: Retrier
    store: RetryingLeaseStore
    stream_client: RetryingStreamClient
    locks: RetryingCoordinatorState
    registry: WorkerRegistry
    coordinator: LeaseCoordinator
    #: Heartbeats and the following of silent workers (``early_failover``), else None.
    early_failover: EarlyFailover | None
    elector: LeaderElector
    shard_sync: ShardSync
    duties: LeaderDuties
    #: The stream consumers shards are read through (retrieval="fanout"), else None.
    fanout: FanOutConsumers | None
    supervisor: ShardSupervisor
    #: Leader-based modes (``kcl3``, ``load``): the leader's loop and this worker's discovery.
    assignment: LeaderAssignment | None
    discovery: AssignmentDiscovery | None


def build_parts(
    spec: WorkerSpec,
    *,
    store: LeaseStore,
    stream_client: StreamClient,
    locks: CoordinatorStateStore,
    registry: WorkerRegistry,
    wall_clock: Callable[[], float],
    cpu_reader: CpuReader | None,
    fanout: FanOutClient | None,
    wake_taker: Callable[[], None],
    on_failure: Callable[[BaseException], None],
) -> WorkerParts:
    """Build a worker's parts (inside the running event loop, whose clock they read).

    ``wake_taker`` starts a taking round early (new leases, a worker joined); ``on_failure``
    stops the worker gracefully because of a pipeline's error."""
    cfg = spec.config
    # Every adapter call of every part goes through the one retry policy table.
    retrier = retrier_for(spec)
    retrying_store = RetryingLeaseStore(store, retrier)
    retrying_client = RetryingStreamClient(stream_client, retrier)
    retrying_locks = RetryingCoordinatorState(locks, retrier)
    retrying_registry = RetryingWorkerRegistry(registry, retrier)
    coordinator = LeaseCoordinator(
        store=retrying_store,
        worker_id=spec.worker_id,
        failover_time=cfg.failover_time,
        renewer_interval=cfg.renewer_interval,
        taker_interval=cfg.taker_interval,
        taker=spec.taker,
        max_leases_for_worker=cfg.max_leases_for_worker,
        max_leases_to_steal=cfg.max_leases_to_steal,
        metrics=spec.metrics,
        application=spec.application,
        listener=_NotListening(),
        graceful_handoff=cfg.graceful_handoff,
        handoff_timeout=cfg.handoff_timeout,
        worker_timeout=cfg.effective_worker_timeout,
        rng=spec.rng,
        registry=retrying_registry,
        wall_clock=wall_clock,
        cpu_reader=cpu_reader,
        max_cpu_percent=cfg.max_cpu_percent,
        capacity_kbps=cfg.worker_capacity_kbps,
        heartbeat_interval=cfg.effective_heartbeat_interval,
    )
    elector = LeaderElector(
        store=retrying_locks,
        worker_id=spec.worker_id,
        lock_duration=cfg.leader_lock_duration,
        heartbeat_interval=cfg.leader_heartbeat_interval,
        rng=spec.rng,
        # The loop's clock, bound now: ``is_leader`` (and so ``Consumer.health``) is then
        # readable from any thread, e.g. a web framework's thread pool.
        clock=asyncio.get_running_loop().time,
    )
    early_failover = (
        EarlyFailover(
            coordinator,
            cfg.effective_heartbeat_interval,
            wake_taker=wake_taker,
            is_leader=elector.is_leader,
        )
        if cfg.effective_heartbeat_interval is not None
        else None
    )
    shard_sync = shard_sync_for(spec, retrying_store, retrying_client, coordinator, wake_taker)
    duties = LeaderDuties(
        config=cfg,
        elector=elector,
        shard_sync=shard_sync,
        store=retrying_store,
        stream_client=retrying_client,
        clock=coordinator.now,
    )
    fanout_consumers = fanout_consumers_for(spec, fanout)
    supervisor = ShardSupervisor(
        config=cfg,
        coordinator=coordinator,
        store=retrying_store,
        stream_client=retrying_client,
        factory=spec.factory,
        metrics=spec.metrics,
        labels=(spec.application, spec.worker_id),
        stream_of=shard_sync.stream_of,
        on_children_created=wake_taker,
        on_failure=on_failure,
        fanout=fanout_consumers,
    )
    coordinator.listener = supervisor
    assignment: LeaderAssignment | None = None
    discovery: AssignmentDiscovery | None = None
    if cfg.lease_taker.leader_based:
        assignment, discovery = assignment_tasks(
            coordinator,
            elector,
            policy=cfg.lease_taker,
            interval=cfg.effective_assignment_interval,
            discovery_interval=cfg.effective_discovery_interval,
            registry=retrying_registry,
            rng=spec.rng,
            balancer=cfg.balancer_settings(),
            kcl3=cfg.kcl3_settings(),
        )
    return WorkerParts(
        retrier=retrier,
        store=retrying_store,
        stream_client=retrying_client,
        locks=retrying_locks,
        registry=retrying_registry,
        coordinator=coordinator,
        early_failover=early_failover,
        elector=elector,
        shard_sync=shard_sync,
        duties=duties,
        fanout=fanout_consumers,
        supervisor=supervisor,
        assignment=assignment,
        discovery=discovery,
    )
