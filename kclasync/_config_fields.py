"""The value types and validators of ``ConsumerConfig``'s fields: the enums a setting takes,
the checks that name the bad field in a ``ConfigError``, and the documentation metadata.

Must not: hold settings or defaults (``kclasync._config``), or decide anything at run time.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import attrs

from kclasync._core.leases.position import InitialPosition
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


def _number(name: str, value: Any) -> float:
    """A finite int or float (not a bool), as a float; ConfigError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(name, f"must be a number, got {value!r:.60}")
    try:
        number = float(value)
    except OverflowError:
        raise ConfigError(name, f"is too large: {value!r:.60}") from None
    if not math.isfinite(number):
        raise ConfigError(name, f"must be a finite number, got {value!r}")
    return number


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if _number(attribute.name, value) <= 0:
        raise ConfigError(attribute.name, f"must be greater than 0, got {value!r}")


def _optional_positive(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _positive(instance, attribute, value)


def _non_negative(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if _number(attribute.name, value) < 0:
        raise ConfigError(attribute.name, f"must not be negative, got {value!r}")


def _whole(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(attribute.name, f"must be a whole number, got {value!r:.60}")


def _optional_whole(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _whole(instance, attribute, value)


def _flag(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(attribute.name, f"must be True or False, got {value!r:.60}")


def _optional_name(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigError(attribute.name, f"must be a non-empty string, got {value!r:.60}")


def _initial_position(value: Any) -> InitialPosition:
    if isinstance(value, InitialPosition):
        return value
    if isinstance(value, str):
        try:
            return InitialPosition.parse(value)
        except ValueError as exc:
            raise ConfigError("initial_position", str(exc)) from None
    raise ConfigError(
        "initial_position", f"must be an InitialPosition or a string, got {value!r:.60}"
    )


class LeaseTakerKind(str, enum.Enum):
    """How leases are spread. ``balanced`` and ``kcl2``: every worker takes and steals.
    ``kcl3`` and ``load``: only the leader assigns (the KCL 3.x variance decider, or the
    load-aware planner); the other workers process what the leader assigned to them."""

    BALANCED = "balanced"
    KCL2 = "kcl2"
    KCL3 = "kcl3"
    LOAD = "load"

    @property
    def leader_based(self) -> bool:
        return self in (LeaseTakerKind.KCL3, LeaseTakerKind.LOAD)


def _taker_kind(value: Any) -> LeaseTakerKind:
    try:
        return LeaseTakerKind(value)
    except (ValueError, TypeError):
        raise ConfigError("lease_taker", "must be 'balanced', 'kcl2', 'kcl3' or 'load'") from None


def _error_policy(value: Any) -> ProcessorErrorPolicy:
    try:
        return ProcessorErrorPolicy(value)
    except (ValueError, TypeError):
        choices = ", ".join(p.value for p in ProcessorErrorPolicy)
        raise ConfigError("processor_error_policy", f"must be one of {choices}") from None


def _meta(unit: str, kcl: str = "") -> dict[str, str]:
    """A field's documentation metadata: its unit ("s" for seconds, "" for none) and the name
    of the Java KCL's setting it corresponds to, if any (the configuration reference shows both)."""
    return {"unit": unit, "kcl": kcl}


class RetrievalMode(str, enum.Enum):
    """How shards are read: ``polling`` (GetRecords) or ``fanout`` (enhanced fan-out:
    SubscribeToShard through a registered stream consumer; see docs/fanout.md)."""

    POLLING = "polling"
    FANOUT = "fanout"


def _retrieval(value: Any) -> RetrievalMode:
    try:
        return RetrievalMode(value)
    except ValueError:
        raise ConfigError("retrieval", "must be 'polling' or 'fanout'") from None
