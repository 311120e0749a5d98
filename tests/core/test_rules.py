"""Pure core: checkpoint rules, expiry judged on the local clock, positions, config validation."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kclasync import ConfigError, ConsumerConfig, InitialPosition
from kclasync._core.leases.checkpoint_rules import validate_checkpoint
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import LATEST, SHARD_END, TRIM_HORIZON, Checkpoint
from kclasync.errors import InvalidCheckpointError


def cp(seq: int, sub: int = 0) -> Checkpoint:
    return Checkpoint(str(seq), sub)


class TestCheckpointRules:
    def test_forward_within_delivered_is_allowed(self) -> None:
        assert validate_checkpoint(
            cp(5), current=cp(3), last_delivered=cp(9), shard_end_reached=False
        ) == cp(5)

    def test_from_a_sentinel(self) -> None:
        assert validate_checkpoint(
            cp(1), current=TRIM_HORIZON, last_delivered=cp(1), shard_end_reached=False
        ) == cp(1)

    @pytest.mark.parametrize(
        ("requested", "current", "delivered", "message"),
        [
            (cp(2), cp(3), cp(9), "before the current checkpoint"),
            (cp(10), cp(3), cp(9), "beyond the last delivered"),
            (cp(9, 2), cp(3), cp(9, 1), "beyond the last delivered"),
            (cp(1), TRIM_HORIZON, None, "no record has been delivered"),
            (LATEST, cp(3), cp(9), "cannot be checkpointed"),
        ],
    )
    def test_illegal(
        self, requested: Checkpoint, current: Checkpoint, delivered: Checkpoint | None, message: str
    ) -> None:
        with pytest.raises(InvalidCheckpointError, match=message):
            validate_checkpoint(
                requested, current=current, last_delivered=delivered, shard_end_reached=False
            )

    def test_shard_end_only_after_the_end(self) -> None:
        with pytest.raises(InvalidCheckpointError, match="SHARD_END"):
            validate_checkpoint(
                SHARD_END, current=cp(3), last_delivered=cp(3), shard_end_reached=False
            )
        assert (
            validate_checkpoint(
                SHARD_END, current=cp(3), last_delivered=cp(3), shard_end_reached=True
            )
            == SHARD_END
        )

    def test_nothing_after_shard_end(self) -> None:
        with pytest.raises(InvalidCheckpointError, match="already"):
            validate_checkpoint(
                cp(4), current=SHARD_END, last_delivered=cp(9), shard_end_reached=True
            )

    def test_sequence_numbers_compare_as_integers(self) -> None:
        big = "49590338271490256608559692538361571095921575989136588898"
        assert Checkpoint(big).key() > Checkpoint("9" * 20).key()
        assert TRIM_HORIZON.key() < cp(0).key() < SHARD_END.key()


class TestExpiry:
    def test_unowned_leases_are_available_at_once(self) -> None:
        t = ExpiryTracker(failover_time=10)
        lease = Lease(key="a", counter=3)
        t.observe([lease], now=100)
        assert t.is_expired(lease, 100)

    def test_owned_lease_first_seen_gets_a_full_failover_period(self) -> None:
        t = ExpiryTracker(failover_time=10)
        lease = Lease(key="a", counter=3, owner="w")
        t.observe([lease], now=100)
        assert not t.is_expired(lease, 109)
        t.observe([lease], now=110.5)
        assert t.is_expired(lease, 110.5)

    def test_counter_change_restarts_the_clock(self) -> None:
        t = ExpiryTracker(failover_time=10)
        t.observe([Lease(key="a", counter=3, owner="w")], now=0)
        renewed = Lease(key="a", counter=4, owner="w")
        t.observe([renewed], now=9)
        assert not t.is_expired(renewed, 18)
        assert t.is_expired(renewed, 19.5)

    def test_only_local_observations_matter(self) -> None:
        # The counter is what moves the stamp; there are no timestamps from other hosts.
        t = ExpiryTracker(failover_time=10)
        a = Lease(key="a", counter=1, owner="w")
        t.observe([a], now=1000)
        assert t.last_change("a") == 1000

    def test_forgets_deleted_leases(self) -> None:
        t = ExpiryTracker(failover_time=10)
        t.observe([Lease(key="a", owner="w")], now=0)
        t.observe([], now=1)
        assert t.last_change("a") is None


class TestPositionsAndConfig:
    def test_parse_initial_positions(self) -> None:
        assert InitialPosition.parse("latest") == InitialPosition.latest()
        assert InitialPosition.parse("TRIM_HORIZON") == InitialPosition.trim_horizon()
        at = InitialPosition.parse("AT_TIMESTAMP:2026-01-02T03:04:05+00:00")
        assert at.timestamp == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"failover_time": -1}, "failover_time"),
            ({"failover_time": "10"}, "failover_time"),
            ({"max_records": 20000}, "max_records"),
            ({"max_records": 2.5}, "max_records"),
            ({"initial_position": "SOMETIMES"}, "initial_position"),
            ({"initial_position": "AT_TIMESTAMP"}, "initial_position"),
            ({"max_leases_for_worker": 0}, "max_leases_for_worker"),
            ({"processor_error_policy": "ignore"}, "processor_error_policy"),
            ({"worker_id": "  "}, "worker_id"),
            ({"epsilon": 5, "failover_time": 10}, "epsilon"),
        ],
    )
    def test_bad_configuration_names_the_field(self, kwargs: dict[str, object], field: str) -> None:
        with pytest.raises(ConfigError) as info:
            ConsumerConfig(**kwargs)  # type: ignore[arg-type]
        assert info.value.field == field
        assert field in str(info.value)

    def test_defaults_match_the_kcl(self) -> None:
        c = ConsumerConfig()
        assert c.failover_time == 10
        assert c.renewer_interval == pytest.approx(10 / 3 - 0.025)
        assert c.max_records == 10000
        assert c.idle_time_between_reads == 1.5
        assert c.initial_position == InitialPosition.latest()
