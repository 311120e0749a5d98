"""The one place a worker is wired: its runtime parts, built on a backend's adapters.

Owns: the retry wrappers every adapter call goes through (one policy table per worker), the
lease path's collaborators (``held_leases`` at the bottom; taking, handoffs and renewals on
top of it; the coordinator bundling them), and every other part on them: early failover, leader
elector, shard sync, leader duties, fan-out consumers, shard supervisor, the leader's assignment
loop and this worker's discovery (they run in the leader-based modes, and in the others while
the table's Java workers follow a leader: ``lease_mode``); then the ``Worker`` that runs them.
Must not: start tasks, run anything, make protocol decisions, or create AWS clients (the
backend does); running the parts and the order of a stop are ``worker``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable

from kclasync._adapters.backends import Adapters
from kclasync._adapters.cpu_metrics import CpuReader
from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.protocols import LeaseStore, StreamClient
from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._config import ConsumerConfig, LeaseTakerKind, RetrievalMode
from kclasync._core.assignment.kcl3_decider import Kcl3Settings
from kclasync._core.assignment.lease_taker import LeaseTaker
from kclasync._core.assignment.load_balancer import BalancerSettings
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.held_lease import HeldLease
from kclasync._core.records.fanout_session import ResubscribePolicy
from kclasync._runtime.assignment import assignment_tasks
from kclasync._runtime.early_failover import EarlyFailover
from kclasync._runtime.fanout_streams import FanOutConsumers
from kclasync._runtime.held import HeldLeases, LeaseListener
from kclasync._runtime.leader import LeaderElector
from kclasync._runtime.leader_duties import LeaderDuties
from kclasync._runtime.leader_failover import leader_failover_for
from kclasync._runtime.lease_coordinator import LeaseCoordinator
from kclasync._runtime.lease_handoffs import LeaseHandoffs
from kclasync._runtime.lease_mode import LeaseModeWatch
from kclasync._runtime.lease_renewals import LeaseRenewals
from kclasync._runtime.lease_taking import LeaseTaking
from kclasync._runtime.metrics import ConsumerMetrics
from kclasync._runtime.retrying import (
    RetryingCoordinatorState,
    RetryingLeaseStore,
    RetryingStreamClient,
    RetryingWorkerRegistry,
    lock_short_term,
    worker_retrier,
)
from kclasync._runtime.shard_supervisor import ShardSupervisor
from kclasync._runtime.shard_sync import ShardSync
from kclasync._runtime.worker import Worker, WorkerParts, WorkerSpec, WorkerStop
from kclasync._runtime.worker_presence import WorkerPresence
from kclasync._runtime.worker_startup import WorkerStartup
from kclasync.errors import ConfigError

__all__ = [
    "build_worker",
    "lease_coordinator",
    "shard_sync_for",
]


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
        retrier = worker_retrier(
            spec.config, spec.metrics, (spec.application, spec.worker_id), spec.rng
        )
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
            "retrieval", "fan-out needs the Kinesis client of the AWS backend (backend=AWSBackend)"
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
    """The held leases' listener until the supervisor is attached (nothing is held yet)."""

    def lease_acquired(self, held: HeldLease) -> None:
        raise AssertionError(f"lease {held.key} acquired before the supervisor was attached")

    def lease_lost(self, held: HeldLease, reason: str) -> None:
        return None

    def lease_stop_requested(self, held: HeldLease, reason: str) -> None:
        return None


def lease_coordinator(
    *,
    store: LeaseStore,
    registry: WorkerRegistry,
    worker_id: str,
    application: str,
    metrics: ConsumerMetrics,
    taker: LeaseTaker,
    rng: random.Random,
    failover_time: float,
    renewer_interval: float,
    taker_interval: float,
    max_leases_for_worker: int | None = None,
    max_leases_to_steal: int | None = None,
    listener: LeaseListener | None = None,
    clock: Callable[[], float] | None = None,
    wall_clock: Callable[[], float] | None = None,
    graceful_handoff: bool = False,
    handoff_timeout: float = 30.0,
    worker_timeout: float | None = None,
    cpu_reader: CpuReader | None = None,
    max_cpu_percent: int = 100,
    capacity_kbps: float | None = None,
    cores: float | None = None,
    heartbeat_interval: float | None = None,
) -> LeaseCoordinator:
    """The lease path of one worker, bottom up: the held leases, this worker's registry
    presence, the incoming handoffs, the taking rounds and the renewal rounds, each given only
    what is below it. ``clock`` (default: the running loop's) is the only clock they read;
    ``wall_clock`` (default: ``clock``) stamps the registry entry."""

    def loop_time() -> float:
        return asyncio.get_running_loop().time()

    now = clock if clock is not None else loop_time
    if clock is None:
        # The running loop's clock, bound once: read on every renewal, write and due time.
        with contextlib.suppress(RuntimeError):  # built outside a loop: found on each read
            now = asyncio.get_running_loop().time
    held = HeldLeases(
        store=store,
        worker_id=worker_id,
        failover_time=failover_time,
        handoff_timeout=handoff_timeout,
        metrics=metrics,
        application=application,
        listener=listener if listener is not None else _NotListening(),
        clock=now,
    )
    presence = WorkerPresence(
        registry,
        worker_id,
        wall_clock=wall_clock if wall_clock is not None else now,
        worker_timeout=worker_timeout if worker_timeout is not None else failover_time,
        on_corrupt=metrics.corrupt_worker_entries.labels(*held.labels).set,
        cpu=cpu_reader,
        max_cpu_percent=max_cpu_percent,
        capacity_kbps=capacity_kbps,
        cores=cores,
        processed_kbps=held.processed_kbps,
        heartbeat_interval=heartbeat_interval,
    )
    taking = LeaseTaking(
        held,
        presence,
        taker=taker,
        interval=taker_interval,
        max_leases_for_worker=max_leases_for_worker,
        max_leases_to_steal=max_leases_to_steal,
        rng=rng,
        graceful_handoff=graceful_handoff,
    )
    handoffs = LeaseHandoffs(
        held,
        is_live=taking.owner_live,
        worker_failover=presence.tracker.failover_time,
    )
    renewals = LeaseRenewals(
        held, handoffs, presence, interval=renewer_interval, failover_time=failover_time
    )
    return LeaseCoordinator(
        held=held, taking=taking, renewals=renewals, handoffs=handoffs, presence=presence
    )


def balancer_settings(cfg: ConsumerConfig) -> BalancerSettings:
    """The ``load`` planner's settings from a configuration."""
    return BalancerSettings(
        trigger_percent=cfg.rebalance_threshold_percent,
        target_percent=cfg.rebalance_target_percent,
        min_gain_percent=cfg.rebalance_min_gain_percent,
        noise_floor_percent=cfg.rebalance_noise_floor_percent,
        max_moves=cfg.max_moves_per_assignment,
    )


def kcl3_settings(cfg: ConsumerConfig) -> Kcl3Settings:
    """The ``kcl3`` decider's settings from a configuration."""
    return Kcl3Settings(
        rebalance_threshold_percent=cfg.rebalance_threshold_percent,
        dampening_percent=cfg.dampening_percent,
        variance_balancing_frequency=cfg.variance_balancing_frequency,
    )


def build_worker(
    spec: WorkerSpec, adapters: Adapters, *, stop_requested: asyncio.Event, started: asyncio.Event
) -> Worker:
    """Build a worker on a backend's adapters (inside the running event loop, whose clock its
    parts read). A pipeline's error stops it gracefully (``WorkerStop``)."""
    cfg = spec.config
    stop = WorkerStop(stop_requested)
    taker_wake = asyncio.Event()
    wake_taker = taker_wake.set
    # Every adapter call of every part goes through the one retry policy table.
    retrier = worker_retrier(
        spec.config, spec.metrics, (spec.application, spec.worker_id), spec.rng
    )
    store = RetryingLeaseStore(adapters.store, retrier)
    stream_client = RetryingStreamClient(adapters.stream_client, retrier)
    locks = RetryingCoordinatorState(adapters.locks, retrier)
    registry = RetryingWorkerRegistry(adapters.registry, retrier)
    coordinator = lease_coordinator(
        store=store,
        registry=registry,
        worker_id=spec.worker_id,
        application=spec.application,
        metrics=spec.metrics,
        taker=spec.taker,
        rng=spec.rng,
        failover_time=cfg.failover_time,
        renewer_interval=cfg.renewer_interval,
        taker_interval=cfg.taker_interval,
        max_leases_for_worker=cfg.max_leases_for_worker,
        max_leases_to_steal=cfg.max_leases_to_steal,
        wall_clock=adapters.wall_clock,
        graceful_handoff=cfg.graceful_handoff,
        handoff_timeout=cfg.handoff_timeout,
        worker_timeout=cfg.effective_worker_timeout,
        cpu_reader=adapters.cpu_reader,
        max_cpu_percent=cfg.max_cpu_percent,
        capacity_kbps=cfg.worker_capacity_kbps,
        cores=cfg.worker_cores,
        heartbeat_interval=cfg.effective_heartbeat_interval,
    )
    elector = LeaderElector(
        store=locks,
        worker_id=spec.worker_id,
        lock_duration=cfg.leader_lock_duration,
        heartbeat_interval=cfg.leader_heartbeat_interval,
        rng=spec.rng,
        # The short term of a kclasync-only fleet needs the leader's registry watch.
        failover_time=lock_short_term(cfg),
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
            leader_id=elector.leader_id,
        )
        if cfg.effective_heartbeat_interval is not None
        else None
    )
    if early_failover is not None:
        coordinator.taking.known_silent = early_failover.is_silent
    shard_sync = shard_sync_for(spec, store, stream_client, coordinator, wake_taker)
    duties = LeaderDuties(
        config=cfg,
        elector=elector,
        shard_sync=shard_sync,
        store=store,
        stream_client=stream_client,
        clock=coordinator.now,
    )
    fanout_consumers = fanout_consumers_for(spec, adapters.fanout)
    supervisor = ShardSupervisor(
        config=cfg,
        leases=coordinator.held,
        exclude=coordinator.taking.exclude,
        store=store,
        stream_client=stream_client,
        factory=spec.factory,
        metrics=spec.metrics,
        labels=(spec.application, spec.worker_id),
        stream_of=shard_sync.stream_of,
        on_children_created=wake_taker,
        on_failure=stop.fail,
        fanout=fanout_consumers,
    )
    coordinator.held.listener = supervisor
    if supervisor.read_slots is not None:
        coordinator.renewals.on_lateness = supervisor.read_slots.observe
    # Every worker can run the leader's assignment: a configured leader-based taker always, a
    # worker-side one (with the kcl3 policy) while the table's Java workers follow a leader.
    leader_based = cfg.lease_taker.leader_based
    coordinator.taking.leader_assigns = leader_based
    lease_mode = LeaseModeWatch(
        locks=locks,
        taking=coordinator.taking,
        presence=coordinator.presence,
        store=store,
        worker_id=spec.worker_id,
        failover_time=cfg.failover_time,
        configured=cfg.lease_taker.value,
        configured_leader_based=leader_based,
        interval=cfg.leader_heartbeat_interval,
        wake=taker_wake,
    )
    assignment, discovery = assignment_tasks(
        coordinator,
        elector,
        policy=cfg.lease_taker if leader_based else LeaseTakerKind.KCL3,
        interval=cfg.effective_assignment_interval,
        discovery_interval=cfg.effective_discovery_interval,
        registry=registry,
        rng=spec.rng,
        balancer=balancer_settings(cfg),
        kcl3=kcl3_settings(cfg),
    )
    startup = WorkerStartup(
        cfg,
        store=store,
        locks=locks,
        registry=registry,
        shard_sync=shard_sync,
        legacy_cleanup=adapters.legacy_cleanup,
        lease_mode=lease_mode,
    )
    parts = WorkerParts(
        retrier=retrier,
        store=store,
        stream_client=stream_client,
        locks=locks,
        registry=registry,
        coordinator=coordinator,
        early_failover=early_failover,
        elector=elector,
        shard_sync=shard_sync,
        duties=duties,
        fanout=fanout_consumers,
        supervisor=supervisor,
        assignment=assignment,
        discovery=discovery,
        lease_mode=lease_mode,
        startup=startup,
        taker_wake=taker_wake,
        leader_failover=leader_failover_for(
            enabled=leader_based and cfg.early_failover,
            holder=coordinator,
            elector=elector,
            assignment=assignment,
            registry=registry,
        ),
    )
    return Worker(spec, parts, stop=stop, started=started)
