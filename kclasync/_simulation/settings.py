"""The knobs of one simulation run, and the worker configuration they imply.

Owns: ``SimulationSettings`` (fleet size, fault kinds and rates, timings, the taker) with their
validation, and the names of the simulated stream and application.
Must not: build or run anything.
"""

from __future__ import annotations

import attrs

from kclasync._config import ConsumerConfig
from kclasync._core.assignment.balanced_taker import BalancedLeaseTaker
from kclasync._core.assignment.lease_taker import Kcl2LeaseTaker, LeaseTaker
from kclasync._simulation.faults import ALL_FAULTS

TAKERS = ("kcl2", "balanced", "kcl3", "load")
STREAM = "sim"
APPLICATION = "sim"


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
    #: ``kcl2`` (the Java KCL 2.x rules, the default taker), ``balanced``, or the leader-based
    #: ``kcl3`` and ``load`` (the workers then share one leader lock).
    taker: str = "kcl2"
    records_per_shard_per_minute: float = 2.0
    idle_time_between_reads: float = 2.0
    #: The longest idle pause (``_core/read_pacing``); None: the consumer's default (4 x idle).
    max_idle_time_between_reads: float | None = None
    #: Processors checkpoint at most this often (and at shutdown and shard end); None: failover.
    checkpoint_interval: float | None = None
    #: Processors record a checkpoint in memory after every batch (``persist=False``) and the
    #: runtime writes it every ``checkpoint_interval`` (instead of the processor writing itself).
    buffered_checkpoints: bool = False
    shard_sync_interval: float = 60.0
    max_records: int = 1000
    #: After the faults stop: give up on balance and drain after this many taker periods.
    settle_rounds: int = 150
    #: The workers' ``early_failover`` (registry heartbeats; scans at the KCL's period).
    early_failover: bool = True

    def __attrs_post_init__(self) -> None:
        if self.workers < 1 or self.shards < 1:
            raise ValueError("workers and shards must be at least 1")
        if self.hours <= 0:
            raise ValueError("hours must be positive")
        if self.taker not in TAKERS:
            raise ValueError(f"taker must be one of {', '.join(TAKERS)}, not {self.taker!r}")
        unknown = self.faults - ALL_FAULTS
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}")

    def consumer_config(self, worker_id: str) -> ConsumerConfig:
        f = self.failover_time
        return ConsumerConfig(
            failover_time=f,
            initial_position="TRIM_HORIZON",
            idle_time_between_reads=self.idle_time_between_reads,
            max_idle_time_between_reads=self.max_idle_time_between_reads,
            min_time_between_reads=0.2,
            max_records=self.max_records,
            processor_retry_backoff=0.5,
            shard_sync_interval=self.shard_sync_interval,
            parent_shard_poll_interval=f / 2,
            shutdown_timeout=3 * f,
            failed_shard_backoff=3 * f,
            worker_id=worker_id,
            checkpoint_interval=self.checkpoint_interval or f,
            lease_taker=self.taker,
            # Leader-based modes: a lock that fails over within a few failover times.
            leader_lock_duration=3 * f,
            leader_heartbeat_interval=f / 2,
            early_failover=self.early_failover,
        )

    @property
    def leader_based(self) -> bool:
        return self.taker in ("kcl3", "load")

    def lease_taker(self) -> LeaseTaker:
        if self.taker == "balanced":
            return BalancedLeaseTaker(steal_budget=None)
        return Kcl2LeaseTaker()


__all__ = ["APPLICATION", "STREAM", "TAKERS", "SimulationSettings"]
