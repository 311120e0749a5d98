"""The rules between ``ConsumerConfig``'s fields: settings that are each valid on their own but
not together (a renewal period that leaves no room, a backoff above its cap, a heartbeat as long
as the lock it keeps), each refused with a ``ConfigError`` that names the field to change.

Owns: those cross-field rules, checked once when a configuration is made.
Must not: hold settings or defaults (``kclasync._config``), check one field alone (the field's
validator in ``kclasync._config_fields`` does), or derive periods (``_core.leases.periods``).
"""

from __future__ import annotations

from typing import Protocol

from kclasync._core.leases.periods import ENTRY_RESOLUTION
from kclasync.errors import ConfigError

#: The most records one GetRecords call may ask for.
MAX_RECORDS_LIMIT = 10000
#: The service ends every SubscribeToShard call after this many seconds.
SUBSCRIPTION_LIFETIME = 300


class _Settings(Protocol):
    """The fields of ``ConsumerConfig`` the rules read (the configuration imports this module,
    not the other way round)."""

    @property
    def max_records(self) -> int: ...
    @property
    def epsilon(self) -> float: ...
    @property
    def failover_time(self) -> float: ...
    @property
    def throttle_backoff(self) -> float: ...
    @property
    def max_backoff(self) -> float: ...
    @property
    def leader_heartbeat_interval(self) -> float: ...
    @property
    def leader_lock_duration(self) -> float: ...
    @property
    def cleanup_leases_upon_shard_completion(self) -> bool: ...
    @property
    def rebalance_target_percent(self) -> float: ...
    @property
    def rebalance_threshold_percent(self) -> float: ...
    @property
    def worker_timeout(self) -> float | None: ...
    @property
    def renewer_interval(self) -> float: ...
    @property
    def fanout_refresh_after(self) -> float: ...


def check_fields_agree(cfg: _Settings) -> None:
    """Raise ``ConfigError`` for the first rule between fields that ``cfg`` breaks."""
    if cfg.max_records > MAX_RECORDS_LIMIT:
        raise ConfigError(
            "max_records", f"must be at most {MAX_RECORDS_LIMIT}, got {cfg.max_records}"
        )
    if cfg.epsilon * 3 >= cfg.failover_time:
        raise ConfigError(
            "epsilon", f"must be well below failover_time / 3 ({cfg.failover_time!r} / 3)"
        )
    if cfg.throttle_backoff > cfg.max_backoff:
        raise ConfigError("throttle_backoff", "must not exceed max_backoff")
    if cfg.leader_heartbeat_interval >= cfg.leader_lock_duration:
        raise ConfigError("leader_heartbeat_interval", "must be shorter than leader_lock_duration")
    if not isinstance(cfg.cleanup_leases_upon_shard_completion, bool):
        raise ConfigError("cleanup_leases_upon_shard_completion", "must be True or False")
    if cfg.rebalance_target_percent > cfg.rebalance_threshold_percent:
        raise ConfigError(
            "rebalance_target_percent",
            f"must not exceed rebalance_threshold_percent ({cfg.rebalance_threshold_percent:g})",
        )
    for name in ("dampening_percent", "max_cpu_percent"):
        value = getattr(cfg, name)
        if value > 100:
            raise ConfigError(name, f"must be at most 100, got {value}")
    if (
        cfg.worker_timeout is not None
        and cfg.worker_timeout <= cfg.renewer_interval + ENTRY_RESOLUTION
    ):
        raise ConfigError(
            "worker_timeout",
            "must exceed the registry report period (the renewer interval, "
            f"{cfg.renewer_interval:g}s) + 1s, because entries carry whole seconds",
        )
    if cfg.fanout_refresh_after >= SUBSCRIPTION_LIFETIME:
        raise ConfigError(
            "fanout_refresh_after", f"must be below the service's {SUBSCRIPTION_LIFETIME} s"
        )
