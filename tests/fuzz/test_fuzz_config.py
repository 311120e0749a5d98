"""Fuzzing ``ConsumerConfig``: any value of any type for any field is accepted (and then usable:
the derived intervals compute) or rejected with ``ConfigError`` naming that field."""

from __future__ import annotations

import enum
import math
from datetime import UTC, datetime
from typing import Any

import attrs
from hypothesis import example, given
from hypothesis import strategies as st

from kclasync import ConsumerConfig
from kclasync._core.leases.position import InitialPosition
from kclasync.errors import ConfigError
from tests.fuzz.profile import FUZZ

FIELDS = [f.name for f in attrs.fields(ConsumerConfig)]

values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.integers(10**300, 10**400),
    st.floats(),  # NaN and infinities included
    st.floats(1e-9, 1e6),
    st.text(max_size=12),
    st.sampled_from(
        ["LATEST", "trim_horizon", "AT_TIMESTAMP:2024-01-01T00:00:00+00:00", "AT_TIMESTAMP:x"]
    ),
    st.sampled_from(["balanced", "kcl2", "fail", "release_shard", " ", ""]),
    st.just(InitialPosition.at_timestamp(datetime(2024, 1, 1, tzinfo=UTC))),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.binary(max_size=4),
)


def check(kwargs: dict[str, Any]) -> ConsumerConfig | ConfigError:
    try:
        config = ConsumerConfig(**kwargs)
    except ConfigError as exc:
        assert exc.field in FIELDS
        assert any(name in str(exc) for name in kwargs), (kwargs, str(exc))
        return exc
    for name in FIELDS:
        value = getattr(config, name)
        if isinstance(value, float):
            assert math.isfinite(value), name
        assert not isinstance(value, (list, dict, bytes)), name
    for value in (
        config.renewer_interval,
        config.taker_interval,
        config.effective_worker_timeout,
    ):
        assert math.isfinite(value) and value > 0
    for name in ("graceful_handoff", "cleanup_leases_upon_shard_completion"):
        assert isinstance(getattr(config, name), bool)
    for name in ("worker_id", "table_name"):
        assert getattr(config, name) is None or isinstance(getattr(config, name), str)
    assert isinstance(config.initial_position, InitialPosition)
    assert isinstance(config.lease_taker, enum.Enum)
    assert isinstance(config.processor_error_policy, enum.Enum)
    return config


@FUZZ
@example("failover_time", None)
@example("max_records", None)
@example("worker_id", 5)
@example("graceful_handoff", "no")
@example("failover_time", float("nan"))
@example("failover_time", 10**400)
@example("lease_taker", ["balanced"])
@given(st.sampled_from(FIELDS), values)
def test_any_value_for_any_field(name: str, value: Any) -> None:
    result = check({name: value})
    if isinstance(result, ConfigError):
        assert name in str(result)


@FUZZ
@given(st.dictionaries(st.sampled_from(FIELDS), values, min_size=2, max_size=5))
def test_several_fields(kwargs: dict[str, Any]) -> None:
    check(kwargs)


@FUZZ
@given(st.sampled_from(FIELDS), st.floats(1e-6, 1e5) | st.integers(1, 10**5))
def test_plausible_numbers(name: str, value: float) -> None:
    """Numbers in range are accepted unless they break a stated relation between fields."""
    result = check({name: value})
    if isinstance(result, ConfigError):
        assert name in str(result)
