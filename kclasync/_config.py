"""Consumer configuration: every setting, its default (the Java KCL's) and its documentation.

Owns: ``ConsumerConfig``'s fields, and the values derived from them that the runtime reads
(the periods), each computed by the core; the planners' settings are built from it in
``kclasync._runtime.wiring``.
Must not: check fields (one alone: ``kclasync._config_fields``; several together:
``kclasync._config_checks``) or decide a period itself (``kclasync._core.leases.periods``).
"""

from __future__ import annotations

import attrs

from kclasync._config_checks import check_fields_agree
from kclasync._config_fields import (
    LeaseTakerKind,
    ProcessorErrorPolicy,
    RetrievalMode,
    _error_policy,
    _flag,
    _initial_position,
    _meta,
    _non_negative,
    _optional_name,
    _optional_positive,
    _optional_whole,
    _positive,
    _retrieval,
    _taker_kind,
    _whole,
)
from kclasync._core.leases import periods
from kclasync._core.leases.position import InitialPosition
from kclasync._core.records.read_pacing import idle_ceiling

#: The enums are defined with the field checks; users and the runtime import them from here.
__all__ = ["ConsumerConfig", "LeaseTakerKind", "ProcessorErrorPolicy", "RetrievalMode"]


@attrs.frozen(kw_only=True)
class ConsumerConfig:
    """Tuning for one consumer. Times are in seconds. Defaults match the Java KCL's."""

    #: A lease whose counter has not moved for this long is expired (KCL failoverTimeMillis).
    failover_time: float = attrs.field(
        default=10.0, validator=_positive, metadata=_meta("s", kcl="failoverTimeMillis")
    )
    #: Slack subtracted from the renewal period and added to the taker period.
    epsilon: float = attrs.field(
        default=0.025, validator=_non_negative, metadata=_meta("s", kcl="epsilonMillis")
    )
    #: Where leases created on an empty table start.
    initial_position: InitialPosition = attrs.field(
        default=InitialPosition.latest(),
        converter=_initial_position,
        metadata=_meta("", kcl="initialPositionInStreamExtended"),
    )
    #: At most this many leases per worker (None: unlimited).
    max_leases_for_worker: int | None = attrs.field(
        default=None,
        validator=[_optional_whole, _optional_positive],
        metadata=_meta("leases", kcl="maxLeasesForWorker"),
    )
    #: How leases are spread: ``balanced`` (batch stealing over the worker registry: balanced in
    #: one round, moves handed over gracefully), ``kcl2`` (the Java KCL 2.x rules), or
    #: leader-based: ``kcl3`` (the KCL 3.x variance decider) and ``load`` (the load-aware
    #: planner), where only the leader assigns and the others find their leases by the owner index.
    lease_taker: LeaseTakerKind = attrs.field(
        default=LeaseTakerKind.BALANCED, converter=_taker_kind, metadata=_meta("")
    )
    #: Leader-based modes: how often the leader plans. None: 2 x failover_time (the KCL 3.x
    #: default of leaseAssignmentIntervalMillis).
    assignment_interval: float | None = attrs.field(
        default=None,
        validator=_optional_positive,
        metadata=_meta("s", kcl="leaseAssignmentIntervalMillis"),
    )
    #: Leader-based modes: rebalance only when a worker's load is too far from the fleet's.
    #: ``load``: above the capacity-weighted level (or an unmovable hot lease's peak) + this
    #: percentage, or above its operating range. ``kcl3``: outside the mean +- this
    #: (reBalanceThresholdPercentage).
    rebalance_threshold_percent: float = attrs.field(
        default=10.0,
        validator=_positive,
        metadata=_meta("%", kcl="reBalanceThresholdPercentage"),
    )
    #: ``load``: once triggered, plan moves until no worker is above the level (or peak) + this
    #: percentage (at most ``rebalance_threshold_percent``).
    rebalance_target_percent: float = attrs.field(
        default=5.0, validator=_non_negative, metadata=_meta("%")
    )
    #: ``load``: a move must lower the higher load of its two workers by at least this share of
    #: the mean load (a guard against moving for noise).
    rebalance_min_gain_percent: float = attrs.field(
        default=1.0, validator=_non_negative, metadata=_meta("%")
    )
    #: ``load``: a worker's measured CPU (no capacity known) less than this many CPU percentage
    #: points from the mean is noise: no rebalance for it, however large a share of a tiny
    #: mean it is (loads predicted from a capacity have no such floor).
    rebalance_noise_floor_percent: float = attrs.field(
        default=1.0, validator=_non_negative, metadata=_meta("%")
    )
    #: ``load``: at most this many graceful moves per assignment run (None: as many as the plan
    #: needs; assignments of unowned leases are never capped).
    max_moves_per_assignment: int | None = attrs.field(
        default=None, validator=[_optional_whole, _optional_positive], metadata=_meta("leases")
    )
    #: ``kcl3``: the share (1-100) of a donor's excess load it gives away per balancing run.
    dampening_percent: int = attrs.field(
        default=60, validator=[_whole, _positive], metadata=_meta("%", kcl="dampeningPercentage")
    )
    #: ``kcl3``: balance on every this-many-th assignment run (assign on every run).
    variance_balancing_frequency: int = attrs.field(
        default=3,
        validator=[_whole, _positive],
        metadata=_meta("runs", kcl="varianceBalancingFrequency"),
    )
    #: KB/s this worker can process at 100 % CPU, reported to the leader with its metrics (the
    #: ``cap`` attribute of its ``<app>-WorkerMetricStats`` entry) so that ``load`` weights
    #: workers by it. None: estimated from the CPU samples against the throughput processed
    #: (nothing is reported before the worker has both).
    worker_capacity_kbps: float | None = attrs.field(
        default=None, validator=_optional_positive, metadata=_meta("KB/s")
    )
    #: The CPUs this worker may use, reported from its first report (the ``cor`` attribute) so
    #: that the ``load`` leader prices it before its capacity is known: at the fleet's known
    #: capacity per CPU times this. None: what its CPU source measures against (the cgroup's
    #: or ECS task's limit, or the host's CPUs); nothing without a CPU source.
    worker_cores: float | None = attrs.field(
        default=None, validator=_optional_positive, metadata=_meta("CPUs")
    )
    #: Leader-based modes: how often a worker queries the owner index for leases assigned to it.
    #: None: failover_time / 3 (well within the failover time, so an assigned lease is renewed
    #: before the leader could judge it expired).
    assignment_discovery_interval: float | None = attrs.field(
        default=None, validator=_optional_positive, metadata=_meta("s")
    )
    #: At most this many leases stolen by one worker in one round (None: no limit; the Java
    #: KCL's maxLeasesToStealAtOneTime is 1).
    max_leases_to_steal: int | None = attrs.field(
        default=None,
        validator=[_optional_whole, _optional_positive],
        metadata=_meta("leases", kcl="maxLeasesToStealAtOneTime"),
    )
    #: Planned moves hand the lease over (the old owner finishes its batch and checkpoints
    #: first) instead of cutting the old owner off.
    graceful_handoff: bool = attrs.field(
        default=True, validator=_flag, metadata=_meta("", kcl="isGracefulLeaseHandoffEnabled")
    )
    #: How long a new owner waits for the old one to finish a handoff before forcing it
    #: (KCL gracefulLeaseHandoffTimeoutMillis).
    handoff_timeout: float = attrs.field(
        default=30.0,
        validator=_positive,
        metadata=_meta("s", kcl="gracefulLeaseHandoffTimeoutMillis"),
    )
    #: A worker whose registry entry (``lut`` in ``<app>-WorkerMetricStats``, whole seconds,
    #: written every renewer interval, or every heartbeat with ``early_failover``) stood still
    #: this long no longer counts as live. Must exceed the renewer interval + 1 s (None: the
    #: failover time + 1 s).
    worker_timeout: float | None = attrs.field(
        default=None, validator=_optional_positive, metadata=_meta("s")
    )
    #: The top of this worker's CPU operating range in percent (1-100), written with its CPU
    #: samples to ``<app>-WorkerMetricStats`` for a KCL 3.x leader's load-aware assignment.
    max_cpu_percent: int = attrs.field(
        default=100,
        validator=[_whole, _positive],
        metadata=_meta("%"),
    )
    #: How often the stream's shard list is compared with the lease table.
    shard_sync_interval: float = attrs.field(
        default=60.0, validator=_positive, metadata=_meta("s", kcl="shardSyncIntervalMillis")
    )
    #: How often a child shard's worker checks whether its parents are finished.
    parent_shard_poll_interval: float = attrs.field(
        default=10.0, validator=_positive, metadata=_meta("s", kcl="parentShardPollIntervalMillis")
    )
    #: GetRecords Limit (1..10000).
    max_records: int = attrs.field(
        default=10000, validator=[_whole, _positive], metadata=_meta("records", kcl="maxRecords")
    )
    #: Pause after a GetRecords call that returned nothing while caught up.
    idle_time_between_reads: float = attrs.field(
        default=1.5, validator=_positive, metadata=_meta("s", kcl="idleTimeBetweenReadsInMillis")
    )
    #: The longest pause of a shard that stays idle: each further empty read while caught up
    #: doubles the pause, from ``idle_time_between_reads`` up to this; a record resets it. A
    #: record written to an idle shard is read within this time (plus one call). None, or at
    #: or below ``idle_time_between_reads``: no growth (the Java KCL's fixed idle pause), so
    #: the wake-up latency stays what ``idle_time_between_reads`` promises unless you raise it
    #: (6 s, 4 x the default idle time, about halves the GetRecords of idle shards).
    max_idle_time_between_reads: float | None = attrs.field(
        default=None, validator=_optional_positive, metadata=_meta("s")
    )
    #: Pause between GetRecords calls that returned records (AWS allows 5 calls/s per shard).
    min_time_between_reads: float = attrs.field(
        default=0.2, validator=_non_negative, metadata=_meta("s")
    )
    #: Batches buffered between a shard's fetcher and its processor; a full queue stops the fetcher.
    max_queued_batches: int = attrs.field(
        default=3,
        validator=[_whole, _positive],
        metadata=_meta("batches", kcl="maxPendingProcessRecordsInput"),
    )
    #: GetRecords calls one worker has in flight at once over all its shards (None: no bound).
    #: A worker whose event loop cannot keep up with its shards' reads then reads less often
    #: instead of queueing a read per shard ahead of its lease renewals.
    max_reads_in_flight: int | None = attrs.field(
        default=32, validator=[_optional_whole, _optional_positive], metadata=_meta("calls")
    )
    #: With ``max_reads_in_flight``: while lease renewals are sent late, fewer reads may be in
    #: flight (halved per step, back one per step once on time; ``core.records.read_admission``):
    #: a busy worker falls behind on records, which it can make up, before it loses leases.
    renewals_first: bool = attrs.field(default=True, validator=_flag, metadata=_meta(""))
    #: First backoff after a throttling error; doubles up to ``max_backoff``.
    throttle_backoff: float = attrs.field(default=0.5, validator=_positive, metadata=_meta("s"))
    #: The longest backoff after throttling or a transient AWS error.
    max_backoff: float = attrs.field(default=10.0, validator=_positive, metadata=_meta("s"))
    #: Retries of a batch whose processor raised, before ``processor_error_policy`` applies.
    processor_retries: int = attrs.field(
        default=3, validator=[_whole, _non_negative], metadata=_meta("retries")
    )
    #: First backoff between processor retries; doubles each time.
    processor_retry_backoff: float = attrs.field(
        default=1.0, validator=_non_negative, metadata=_meta("s")
    )
    #: What happens after the last retry: ``fail`` (the consumer stops, ``run()`` raises
    #: ``ProcessorFailedError``) or ``release_shard`` (only that shard is let go for a while).
    processor_error_policy: ProcessorErrorPolicy = attrs.field(
        default=ProcessorErrorPolicy.FAIL, converter=_error_policy, metadata=_meta("")
    )
    #: With RELEASE_SHARD: how long this worker leaves a shard alone after giving it up.
    failed_shard_backoff: float = attrs.field(
        default=60.0, validator=_positive, metadata=_meta("s")
    )
    #: How long ``stop()`` waits for processors to finish their batch and checkpoint.
    shutdown_timeout: float = attrs.field(
        default=30.0, validator=_positive, metadata=_meta("s", kcl="shutdownGraceMillis")
    )
    #: How often a shard's buffered checkpoints (``checkpoint(..., persist=False)``) are
    #: written; they are also written before SHARD_END, a release, a handoff and a stop.
    checkpoint_interval: float = attrs.field(default=5.0, validator=_positive, metadata=_meta("s"))
    #: Handler mode (``processor=async def handle(records)``): record the checkpoint after each
    #: batch in memory and write it every ``checkpoint_interval`` instead of after every batch
    #: (fewer writes; a crash replays up to that many seconds of records).
    buffered_handler_checkpoints: bool = attrs.field(
        default=False, validator=_flag, metadata=_meta("")
    )
    #: How often the taker scans the table. None: the Java KCL's 2 x (failover + epsilon) with
    #: ``early_failover`` (a dead worker's leases are found through the worker registry), and
    #: failover + epsilon without it (a dead worker's leases are then taken within about
    #: 2 x failover; the KCL's period can take up to 4 x failover).
    lease_taker_interval: float | None = attrs.field(
        default=None, validator=_optional_positive, metadata=_meta("s")
    )
    #: Kcl2 and balanced takers: every worker heartbeats its registry entry every
    #: ``worker_heartbeat_interval`` and reads the registry as often; a worker whose heartbeat
    #: stops is noticed within about two periods, its leases are read at once and taken when
    #: they expire (the expiry rule is unchanged: counter unchanged for the failover time, on
    #: this worker's clock). Failover then takes about failover + 2 heartbeat periods. Off:
    #: the entry is written with each renewal round and dead workers are found by the scans.
    #: Leader-based takers (``load``, ``kcl3``): no heartbeats (the entry is written with each
    #: renewal round); the leader alone reads the registry six times per renewer interval
    #: and reads the leases of a worker whose entry stood still, assigning them once expired
    #: by their counters (about 1.1-1.5 x failover); off: at the next assignment run (2-4 x).
    early_failover: bool = attrs.field(default=True, validator=_flag, metadata=_meta(""))
    #: With ``early_failover``: how often this worker writes its registry entry and reads the
    #: registry (one write and one small scan each). None: failover / 20, at least 0.5 s.
    worker_heartbeat_interval: float | None = attrs.field(
        default=None, validator=_optional_positive, metadata=_meta("s")
    )
    #: Delete a lease at SHARD_END once every child lease exists and has started (see
    #: ``kclasync._core.leases.lease_cleanup``). Off: finished leases stay in the table.
    cleanup_leases_upon_shard_completion: bool = attrs.field(
        default=True, validator=_flag, metadata=_meta("", kcl="cleanupLeasesUponShardCompletion")
    )
    #: A finished lease is deleted no earlier than this long after it was first seen deletable.
    lease_cleanup_delay: float = attrs.field(
        default=60.0, validator=_non_negative, metadata=_meta("s")
    )
    #: How often the leader looks for finished leases to delete.
    lease_cleanup_interval: float = attrs.field(
        default=60.0, validator=_positive, metadata=_meta("s", kcl="leaseCleanupIntervalMillis")
    )
    #: The leader lock's lease: another worker takes the lock over once it has seen it unchanged
    #: for this long (KCL 3.x: 120 s). A leader-based taker with ``early_failover`` writes one
    #: failover time instead (if shorter) while the registry shows no Java worker.
    leader_lock_duration: float = attrs.field(
        default=120.0, validator=_positive, metadata=_meta("s")
    )
    #: How often the lock is read, and renewed by its holder (KCL 3.x: 30 s); with a
    #: leader-based taker and ``early_failover``, at most failover / 4.
    leader_heartbeat_interval: float = attrs.field(
        default=30.0, validator=_positive, metadata=_meta("s")
    )
    #: How often the leader checks the hash-key space covered by leases for holes.
    lease_audit_interval: float = attrs.field(
        default=120.0,
        validator=_positive,
        metadata=_meta("s", kcl="leasesRecoveryAuditorExecutionFrequencyMillis"),
    )
    #: Consecutive audits that must find a hole before the leader runs a shard sync.
    lease_audit_threshold: int = attrs.field(
        default=3,
        validator=[_whole, _positive],
        metadata=_meta("audits", kcl="leasesRecoveryAuditorInconsistencyConfidenceThreshold"),
    )
    #: Multi-stream: a stream that left the list has its leases deleted after this long.
    removed_stream_grace: float = attrs.field(
        default=3600.0,
        validator=_non_negative,
        metadata=_meta("s", kcl="waitPeriodToDeleteFormerStreams"),
    )
    #: Leases are unique per worker id; None picks ``host:pid:random``.
    worker_id: str | None = attrs.field(
        default=None, validator=_optional_name, metadata=_meta("", kcl="workerIdentifier")
    )
    #: Lease table name; None means the application name (as the KCL does).
    table_name: str | None = attrs.field(
        default=None, validator=_optional_name, metadata=_meta("", kcl="tableName")
    )
    #: ``polling`` (GetRecords) or ``fanout`` (enhanced fan-out: SubscribeToShard through a
    #: registered stream consumer; see the fan-out guide).
    retrieval: RetrievalMode = attrs.field(
        default=RetrievalMode.POLLING,
        converter=_retrieval,
        metadata=_meta("", kcl="retrievalSpecificConfig"),
    )
    #: Fan-out: the stream consumer's name, registered (or reused) on each stream; None means
    #: the application name (as the KCL does).
    fanout_consumer_name: str | None = attrs.field(
        default=None, validator=_optional_name, metadata=_meta("", kcl="consumerName")
    )
    #: Fan-out: deregister the stream consumer when this worker stops. Off by default: every
    #: worker of the application shares the registration, and loses its subscriptions when it
    #: goes (they register it again).
    fanout_deregister_on_stop: bool = attrs.field(
        default=False, validator=_flag, metadata=_meta("")
    )
    #: Fan-out: how long to wait for a new stream consumer to become ACTIVE.
    fanout_activation_timeout: float = attrs.field(
        default=60.0, validator=_positive, metadata=_meta("s")
    )
    #: Fan-out: a subscription older than this is renewed by the worker (the service ends each
    #: one after 300 s); one the service ended is renewed at once from its continuation.
    fanout_refresh_after: float = attrs.field(
        default=285.0, validator=_positive, metadata=_meta("s")
    )

    def __attrs_post_init__(self) -> None:
        check_fields_agree(self)

    @property
    def renewer_interval(self) -> float:
        """How often held leases are renewed: failover / 3 - epsilon."""
        return periods.renewer_interval(self.failover_time, self.epsilon)

    @property
    def taker_interval(self) -> float:
        """How often the taker scans and takes: ``lease_taker_interval``, else the KCL's
        2 x (failover + epsilon) with early failover and failover + epsilon without."""
        if self.lease_taker_interval is not None:
            return self.lease_taker_interval
        early = self.effective_heartbeat_interval is not None
        return periods.taker_interval(self.failover_time, self.epsilon, early_failover=early)

    @property
    def effective_heartbeat_interval(self) -> float | None:
        """The registry heartbeat period of early failover; None when it is off (also in the
        leader-based modes, where the leader assigns what a dead worker held)."""
        return periods.heartbeat_interval(
            self.failover_time,
            self.worker_heartbeat_interval,
            early_failover=self.early_failover,
            leader_based=self.lease_taker.leader_based,
        )

    @property
    def effective_worker_timeout(self) -> float:
        if self.worker_timeout is not None:
            return self.worker_timeout
        return periods.worker_timeout(self.failover_time)

    @property
    def effective_max_idle_time(self) -> float:
        """The longest pause between reads of an idle shard (the bound on its wake-up)."""
        return idle_ceiling(self.idle_time_between_reads, self.max_idle_time_between_reads)

    @property
    def effective_assignment_interval(self) -> float:
        if self.assignment_interval is not None:
            return self.assignment_interval
        return periods.assignment_interval(self.failover_time)

    @property
    def effective_discovery_interval(self) -> float:
        if self.assignment_discovery_interval is not None:
            return self.assignment_discovery_interval
        return periods.discovery_interval(self.failover_time)
