"""The periods derived from the failover time (kclasync._core.leases.periods), and the configuration
reading them unchanged."""

from __future__ import annotations

import pytest

from kclasync import ConsumerConfig
from kclasync._core.leases import periods
from kclasync._core.workers.worker_silence import default_heartbeat_interval


def test_renewals_come_three_times_per_failover_time_a_little_early() -> None:
    assert periods.renewer_interval(10.0, 0.025) == pytest.approx(10 / 3 - 0.025)
    assert periods.renewer_interval(10.0, 0.025) * 3 < 10.0


def test_the_taker_period_is_the_kcls_with_early_failover_and_shorter_without() -> None:
    assert periods.taker_interval(10.0, 0.025, early_failover=True) == pytest.approx(20.05)
    assert periods.taker_interval(10.0, 0.025, early_failover=False) == pytest.approx(10.025)


def test_the_heartbeat_is_off_without_early_failover_and_in_leader_modes() -> None:
    hb = periods.heartbeat_interval
    assert hb(10.0, None, early_failover=False, leader_based=False) is None
    assert hb(10.0, 2.0, early_failover=True, leader_based=True) is None
    assert hb(10.0, 2.0, early_failover=True, leader_based=False) == 2.0
    assert hb(30.0, None, early_failover=True, leader_based=False) == (
        default_heartbeat_interval(30.0)
    )


def test_leader_mode_and_registry_periods() -> None:
    assert periods.worker_timeout(10.0) == 11.0
    assert periods.assignment_interval(10.0) == 20.0
    assert periods.discovery_interval(9.0) == 3.0


@pytest.mark.parametrize(
    "config",
    [
        ConsumerConfig(),
        ConsumerConfig(failover_time=3.0, early_failover=False),
        ConsumerConfig(failover_time=30.0, lease_taker="kcl3"),
        ConsumerConfig(failover_time=5.0, worker_heartbeat_interval=0.7),
    ],
)
def test_the_configuration_reads_the_core_periods(config: ConsumerConfig) -> None:
    f, e = config.failover_time, config.epsilon
    heartbeat = periods.heartbeat_interval(
        f,
        config.worker_heartbeat_interval,
        early_failover=config.early_failover,
        leader_based=config.lease_taker.leader_based,
    )
    assert config.effective_heartbeat_interval == heartbeat
    assert config.renewer_interval == periods.renewer_interval(f, e)
    assert config.taker_interval == periods.taker_interval(
        f, e, early_failover=heartbeat is not None
    )
    assert config.effective_worker_timeout == periods.worker_timeout(f)
    assert config.effective_assignment_interval == periods.assignment_interval(f)
    assert config.effective_discovery_interval == periods.discovery_interval(f)
