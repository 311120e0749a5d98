"""The retry policy table: full-jitter delays, budgets, and the class of every adapter call."""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path

import pytest

import kclasync
from kclasync._adapters.protocols import CoordinatorStateStore, LeaseStore, StreamClient
from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._config import ConsumerConfig
from kclasync._core.retry_policy import (
    OP_CLASS,
    START_ATTEMPTS,
    Backoff,
    Jitter,
    OpClass,
    RetryPolicy,
    give_up,
    next_delay,
    policy_table,
    start_delay,
)


def table_for(config: ConsumerConfig) -> dict[OpClass, RetryPolicy]:
    return dict(
        policy_table(
            failover_time=config.failover_time,
            renewer_interval=config.renewer_interval,
            throttle_backoff=config.throttle_backoff,
            max_backoff=config.max_backoff,
            leader_heartbeat_interval=config.leader_heartbeat_interval,
        )
    )


def protocol_methods(proto: type) -> set[str]:
    return {
        name
        for name, value in vars(proto).items()
        if not name.startswith("_") and inspect.iscoroutinefunction(value)
    }


@pytest.mark.parametrize("proto", [LeaseStore, CoordinatorStateStore, StreamClient, WorkerRegistry])
def test_every_adapter_method_has_an_operation_class(proto: type) -> None:
    methods = protocol_methods(proto)
    assert methods, proto
    assert methods <= set(OP_CLASS), methods - set(OP_CLASS)


def test_full_jitter_stays_under_the_capped_exponential() -> None:
    p = RetryPolicy(attempts=10, base=0.1, cap=1.0, budget=100)
    assert next_delay(p, 1, 0.999) == pytest.approx(0.0999)
    assert next_delay(p, 3, 0.5) == pytest.approx(0.2)
    assert next_delay(p, 9, 0.999) == pytest.approx(0.999)  # capped
    assert next_delay(p, 1, 0.0) == 0.0
    assert next_delay(p, 10_000, 0.5) == pytest.approx(0.5)  # no overflow


def test_give_up_on_attempts_or_budget() -> None:
    p = RetryPolicy(attempts=3, base=0.1, cap=1.0, budget=1.0)
    assert not give_up(p, 1, 0.0, 0.1)
    assert give_up(p, 3, 0.0, 0.0)
    assert give_up(p, 1, 0.95, 0.1)  # the wait would end after the budget


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0, base=0.1, cap=1, budget=1)
    with pytest.raises(ValueError):
        RetryPolicy(attempts=2, base=1, cap=0.5, budget=1)


@pytest.mark.parametrize("failover", [0.6, 10.0, 60.0])
def test_budgets_fit_the_protocol_periods(failover: float) -> None:
    config = ConsumerConfig(failover_time=failover)
    t = table_for(config)
    # A renewal is done or given up well inside one renewal period.
    assert t[OpClass.RENEW].budget <= config.renewer_interval / 2
    # The longest possible total wait of a renewal also fits.
    renew = t[OpClass.RENEW]
    assert sum(next_delay(renew, n, 0.999) for n in range(1, renew.attempts)) < (
        config.renewer_interval
    )
    # The taker's scans back off less than writes (failover waits for the next scan).
    assert t[OpClass.SCAN].base < t[OpClass.WRITE].base
    assert t[OpClass.SCAN].cap <= t[OpClass.WRITE].cap
    # Calls that can run under a lease's lock block its renewals: half a period at most.
    for op in (OpClass.RENEW, OpClass.READ, OpClass.WRITE, OpClass.CHECKPOINT):
        assert t[op].budget <= config.renewer_interval / 2
    # The leader lock's calls end before the next heartbeat.
    assert t[OpClass.LOCK].budget < config.leader_heartbeat_interval
    # GetRecords is retried by ShardCursor, table set-up by the start-up step: one attempt.
    assert t[OpClass.READ_RECORDS].attempts == 1
    assert t[OpClass.SETUP].attempts == 1
    assert set(t) == set(OpClass)


def test_start_up_steps_back_off_doubling_up_to_the_cap() -> None:
    cfg = ConsumerConfig()  # throttle_backoff 0.5 s, max_backoff 10 s
    waits = [
        start_delay(n, first=cfg.throttle_backoff, cap=cfg.max_backoff)
        for n in range(1, START_ATTEMPTS)
    ]
    assert waits == [0.5, 1.0, 2.0, 4.0]
    assert start_delay(9, first=0.5, cap=10.0) == 10.0
    # Every wait of a start-up fits well inside a failover time or two.
    assert sum(waits) < 2 * cfg.failover_time


def _doubling(first: float, cap: float, n: int) -> list[float]:
    """The loop every retry site used to write itself: wait, then double up to the cap."""
    waits, delay = [], first
    for _ in range(n):
        waits.append(delay)
        delay = min(delay * 2, cap)
    return waits


@pytest.mark.parametrize(
    ("first", "cap"),
    [(0.1, 5.0), (0.5, 10.0), (0.05, 2.0), (0.2, 5.0), (1.0, 1.0), (0.0, 3.0)],
)
def test_backoff_without_jitter_is_the_doubling_loop_it_replaced(first: float, cap: float) -> None:
    b = Backoff(first, cap)
    assert [b.delay(n) for n in range(1, 13)] == pytest.approx(_doubling(first, cap, 12))


def test_backoff_without_cap_keeps_doubling() -> None:
    # The processor retries: ``processor_retry_backoff * 2 ** (attempt - 1)``, bounded by
    # ``processor_retries`` instead of a cap.
    b = Backoff(1.0)
    assert [b.delay(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert b.delay(100_000) < math.inf  # no overflow


def test_half_jitter_is_the_fanout_and_spark_put_formula() -> None:
    b = Backoff(0.2, 5.0, Jitter.HALF)
    for n, draw in [(1, 0.0), (1, 0.999), (3, 0.5), (9, 0.25), (10_000, 0.75)]:
        # the former ``delay * (0.5 + random() / 2)`` with ``delay`` doubled up to the cap
        assert b.delay(n, draw) == pytest.approx(
            _doubling(0.2, 5.0, min(n, 12))[-1] * (0.5 + draw / 2)
        )
    assert b.delay(1, 0.0) == pytest.approx(0.1)
    assert b.delay(30, 0.999) < 5.0


def test_full_jitter_is_next_delay() -> None:
    p = RetryPolicy(attempts=10, base=0.1, cap=1.0, budget=100)
    for n in range(1, 12):
        for draw in (0.0, 0.3, 0.999):
            assert next_delay(p, n, draw) == Backoff(0.1, 1.0, Jitter.FULL).delay(n, draw)


def test_a_first_wait_above_the_cap_is_capped() -> None:
    # Documented change: the hand-written loops waited ``first`` once even when it was above
    # the cap (only reachable with arguments the configuration check refuses).
    assert Backoff(8.0, 5.0).delay(1) == 5.0
    assert Backoff(8.0, 5.0, Jitter.HALF).delay(1, 0.999) < 5.0


def test_backoff_refuses_negative_times() -> None:
    with pytest.raises(ValueError, match="negative"):
        Backoff(-0.1, 1.0)
    with pytest.raises(ValueError, match="negative"):
        Backoff(0.1, -1.0)


def test_no_retry_loop_outside_the_policy_writes_its_own_backoff() -> None:
    """Every retry loop draws its waits from ``Backoff``: no module of the package doubles a
    delay or draws a jitter factor itself."""
    root = Path(kclasync.__file__).parent
    doubling = re.compile(r"\bdelay \* 2\b|\b2(\.0)? ?\*\* ?\(|random\.random\(\)|random\.uniform")
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        if path.name != "retry_policy.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if doubling.search(line)
    ]
    assert offenders == []
