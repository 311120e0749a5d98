"""Consumer configuration, with the Java KCL's defaults and validation that names the bad field."""

from __future__ import annotations

import enum
from typing import Any

import attrs

from kclasync.core.position import InitialPosition
from kclasync.errors import ConfigError


class ProcessorErrorPolicy(str, enum.Enum):
    """What happens when a processor keeps raising on a batch after every retry.

    ``FAIL``: the consumer stops. ``run()`` raises ``ProcessorFailedError``; the failing shard's
    lease is released without a checkpoint past the failed batch, the other shards are shut down
    gracefully (``shutdown_requested``, checkpoint, release), so another worker or a restart
    retries from the last checkpoint.
    ``RELEASE_SHARD``: only the failing shard stops. Its lease is released uncheckpointed and this
    worker does not take that lease again for ``failed_shard_backoff`` seconds; the failure is
    logged and counted in ``kclasync_processor_failures_total``. Other shards carry on.
    """

    FAIL = "fail"
    RELEASE_SHARD = "release_shard"


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(attribute.name, f"must be a number, got {value!r}")
    if value <= 0:
        raise ConfigError(attribute.name, f"must be greater than 0, got {value!r}")


def _non_negative(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(attribute.name, f"must be a number, got {value!r}")
    if value < 0:
        raise ConfigError(attribute.name, f"must not be negative, got {value!r}")


def _whole(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(attribute.name, f"must be a whole number, got {value!r}")


def _initial_position(value: Any) -> InitialPosition:
    if isinstance(value, InitialPosition):
        return value
    if isinstance(value, str):
        try:
            return InitialPosition.parse(value)
        except ValueError as exc:
            raise ConfigError("initial_position", str(exc)) from None
    raise ConfigError("initial_position", f"must be an InitialPosition or a string, got {value!r}")


def _error_policy(value: Any) -> ProcessorErrorPolicy:
    try:
        return ProcessorErrorPolicy(value)
    except ValueError:
        choices = ", ".join(p.value for p in ProcessorErrorPolicy)
        raise ConfigError("processor_error_policy", f"must be one of {choices}") from None


@attrs.frozen(kw_only=True)
class ConsumerConfig:
    """Tuning for one consumer. Times are in seconds. Defaults match the Java KCL's."""

    #: A lease whose counter has not moved for this long is expired (KCL failoverTimeMillis).
    failover_time: float = attrs.field(default=10.0, validator=_positive)
    #: Slack subtracted from the renewal period and added to the taker period.
    epsilon: float = attrs.field(default=0.025, validator=_non_negative)
    #: Where leases created on an empty table start.
    initial_position: InitialPosition = attrs.field(
        default=InitialPosition.latest(), converter=_initial_position
    )
    #: At most this many leases per worker (None: unlimited).
    max_leases_for_worker: int | None = attrs.field(default=None, validator=[_whole, _positive])
    #: At most this many leases stolen in one taking round.
    max_leases_to_steal: int = attrs.field(default=1, validator=[_whole, _positive])
    #: How often the stream's shard list is compared with the lease table.
    shard_sync_interval: float = attrs.field(default=60.0, validator=_positive)
    #: How often a child shard's worker checks whether its parents are finished.
    parent_shard_poll_interval: float = attrs.field(default=10.0, validator=_positive)
    #: GetRecords Limit (1..10000).
    max_records: int = attrs.field(default=10000, validator=[_whole, _positive])
    #: Pause after a GetRecords call that returned nothing while caught up.
    idle_time_between_reads: float = attrs.field(default=1.5, validator=_positive)
    #: Pause between GetRecords calls that returned records (AWS allows 5 calls/s per shard).
    min_time_between_reads: float = attrs.field(default=0.2, validator=_non_negative)
    #: Batches buffered between a shard's fetcher and its processor; a full queue stops the fetcher.
    max_queued_batches: int = attrs.field(default=3, validator=[_whole, _positive])
    #: First backoff after a throttling error; doubles up to ``max_backoff``.
    throttle_backoff: float = attrs.field(default=0.5, validator=_positive)
    max_backoff: float = attrs.field(default=10.0, validator=_positive)
    #: Retries of a batch whose processor raised, before ``processor_error_policy`` applies.
    processor_retries: int = attrs.field(default=3, validator=[_whole, _non_negative])
    #: First backoff between processor retries; doubles each time.
    processor_retry_backoff: float = attrs.field(default=1.0, validator=_non_negative)
    processor_error_policy: ProcessorErrorPolicy = attrs.field(
        default=ProcessorErrorPolicy.FAIL, converter=_error_policy
    )
    #: With RELEASE_SHARD: how long this worker leaves a shard alone after giving it up.
    failed_shard_backoff: float = attrs.field(default=60.0, validator=_positive)
    #: How long ``stop()`` waits for processors to finish their batch and checkpoint.
    shutdown_timeout: float = attrs.field(default=30.0, validator=_positive)
    #: How often the taker scans the table. None: failover + epsilon, so that a dead worker's
    #: leases are taken within about 2 x failover (the Java KCL scans every 2 x (failover +
    #: epsilon), which can take up to 4 x failover; set that value to match it exactly).
    lease_taker_interval: float | None = attrs.field(default=None, validator=_positive)
    #: Leases are unique per worker id; None picks ``host:pid:random``.
    worker_id: str | None = None
    #: Lease table name; None means the application name (as the KCL does).
    table_name: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.max_records > 10000:
            raise ConfigError("max_records", f"must be at most 10000, got {self.max_records}")
        if self.worker_id is not None and not self.worker_id.strip():
            raise ConfigError("worker_id", "must not be empty")
        if self.epsilon * 3 >= self.failover_time:
            raise ConfigError("epsilon", "must be well below failover_time / 3")
        if self.throttle_backoff > self.max_backoff:
            raise ConfigError("throttle_backoff", "must not exceed max_backoff")

    @property
    def renewer_interval(self) -> float:
        """How often held leases are renewed: failover / 3 - epsilon."""
        return self.failover_time / 3 - self.epsilon

    @property
    def taker_interval(self) -> float:
        """How often the taker scans and takes (``lease_taker_interval`` or failover + epsilon)."""
        if self.lease_taker_interval is not None:
            return self.lease_taker_interval
        return self.failover_time + self.epsilon
