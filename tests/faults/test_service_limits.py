"""The demo's scenario (4 shards, 3 workers, a producer, a worker crashed midway) under the
Kinesis limits production hits, enforced by the proxy (``kclasync.testing.service_limits``).

* With the default read pacing and a producer within the write limits, no limit is ever
  answered after the workers' start;
* with a burst above the limits (a backlog of 6,000 records of 2 KB written as fast as the
  producer can, consumers reading with a tiny idle time), the proxy throttles writes and
  reads, the producer retries its refused entries, the consumers back off, and no record is
  lost;
* with iterators that expire after 2 s and idle shards read every 3 s, every idle read meets
  ExpiredIteratorException, and the consumer resumes after its last record without loss.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

import pytest
from prometheus_client import CollectorRegistry

from kclasync._demo import DemoResult, DemoSettings, _run
from kclasync.testing.emulators import LocalAws, moto_process
from kclasync.testing.fanout_proxy import KinesisLocalFanOutRelay
from kclasync.testing.fault_proxy import Fault, FaultKind, FaultPlan, FaultProxy
from kclasync.testing.service_limits import Limits, ServiceLimits
from tests.faults.fleet import Journal, botocore_options, running, totals
from tests.support import aws_for, wait_until

pytestmark = pytest.mark.asyncio

#: The library's default read pacing (the demo reads faster: it has no limits to respect).
DEFAULT_PACING = {"idle_time_between_reads": 1.5, "min_time_between_reads": 0.2}
WARM_UP = 3.0


@contextlib.asynccontextmanager
async def _limited(limits: ServiceLimits) -> AsyncIterator[LocalAws]:
    """A fresh moto (the demo uses fixed names) behind the limits."""
    with moto_process() as aws:
        async with FaultProxy(aws.endpoint_url, limits=limits) as url:
            yield LocalAws(url)


async def _demo(
    limits: ServiceLimits, settings: DemoSettings, config: Mapping[str, object]
) -> tuple[DemoResult, float]:
    lines: list[str] = []
    async with _limited(limits) as proxied:
        started = asyncio.get_running_loop().time()
        options = botocore_options(proxied.endpoint_url)
        result = await _run(settings, options, lines.append, consumer_config=config)
    return result, started


async def test_default_pacing_stays_within_the_limits() -> None:
    limits = ServiceLimits()
    settings = DemoSettings(duration=16.0, rate=400, backlog=0, failover=3.0)
    result, started = await _demo(limits, settings, DEFAULT_PACING)
    print(f"\nwithin limits: {result}, limit answers {dict(limits.answers)}, {limits.calls}")
    assert result.produced > 5000 and result.lost == 0
    assert result.failover_seconds is not None  # the crash happened and was recovered from
    assert limits.calls["GetRecords"] > 100 and limits.calls["PutRecords"] > 50
    assert limits.calls["untracked"] == 0  # every read was checked against the limits
    assert limits.throttled_since(started + WARM_UP) == {}


async def test_a_burst_above_the_limits_is_throttled_and_nothing_is_lost() -> None:
    limits = ServiceLimits()
    # moto takes about as long to store 500 small records as the limit allows: the records are
    # made 2 KB each, so that the backlog's requests exceed the 1 MB/s per shard.
    settings = DemoSettings(duration=12.0, rate=400, backlog=6_000, failover=3.0, record_size=2_000)
    fast = {"idle_time_between_reads": 0.01, "min_time_between_reads": 0.0}
    result, _ = await _demo(limits, settings, fast)
    print(f"\nburst: {result}, limit answers {dict(limits.answers)}")
    assert result.lost == 0 and result.produced >= 6_000
    assert limits.answers["put_records"] > 0, "the backlog was not throttled"
    assert limits.answers["get_records_rate"] > 0, "the fast readers were not throttled"


async def test_expired_iterators_are_renewed_without_loss(moto: LocalAws, unique_name: str) -> None:
    limits = ServiceLimits(Limits(iterator_lifetime=2.0))
    journal = Journal()
    registry = CollectorRegistry()
    async with (
        aws_for(moto, unique_name) as aws,
        FaultProxy(moto.endpoint_url, limits=limits) as url,
    ):
        await aws.create_stream(2)
        options = botocore_options(url)
        produced: list[int] = []
        async with running(options, unique_name, journal, 1, registry, idle_time_between_reads=3.0):
            for _ in range(4):
                batch = await aws.produce(20)
                produced += batch
                await wait_until(lambda b=batch: journal.seen(b), 20, "the records")  # type: ignore[misc]
                await wait_until(
                    lambda n=limits.answers["expired_iterator"]: (
                        limits.answers["expired_iterator"] > n
                    ),
                    20,
                    "an idle read on an expired iterator",
                )
    retried = totals(registry, "kclasync_aws_retries_total", "code")
    print(f"\nexpiry: limit answers {dict(limits.answers)}, retries {dict(retried)}")
    assert set(produced) <= journal.deliveries.keys()
    assert limits.answers["expired_iterator"] >= 4
    assert journal.duplicate_causes() == {}


async def test_fan_out_within_the_subscribe_limits(kinesis: LocalAws, unique_name: str) -> None:
    """Fan-out on kinesis-local (through the relay that completes its answers): no limit answer
    while subscriptions run; then half the subscriptions cut after their first bytes: the
    resubscriptions lose nothing. Some are still refused: kinesis-local refuses a subscription
    while the one it replaces is being torn down (inside the event stream), and botocore
    retries a throttled SubscribeToShard at once; the count is printed."""
    assert kinesis.kinesis_endpoint_url is not None
    limits = ServiceLimits()
    journal = Journal()
    registry = CollectorRegistry()
    relay = KinesisLocalFanOutRelay(kinesis.kinesis_endpoint_url)
    async with aws_for(kinesis, unique_name) as aws, relay as relay_url:
        upstreams = {"dynamodb": kinesis.endpoint_url, "kinesis": relay_url}
        proxy = FaultProxy(upstreams, limits=limits, seed=5)
        async with proxy as url:
            await aws.create_stream(2)
            options = botocore_options(url)
            # Subscriptions renewed every 6 s (not 285 s): more SubscribeToShard calls to cut.
            fanout = {
                "retrieval": "fanout",
                "fanout_consumer_name": "fan",
                "fanout_refresh_after": 6.0,
            }
            produced: list[int] = []
            async with running(options, unique_name, journal, 1, registry, **fanout):
                for _ in range(3):
                    produced += await aws.produce(50)
                    await wait_until(lambda p=list(produced): journal.seen(p), 30, "records")  # type: ignore[misc]
                steady = dict(limits.answers)
                cut = Fault(FaultKind.RESET_AFTER, 0.5, "kinesis", frozenset({"SubscribeToShard"}))
                proxy.plan = FaultPlan((cut,))
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30
                # Writing until two subscriptions were cut (or 30 s).
                while proxy.injected["reset_after"] < 2 and loop.time() < deadline:
                    produced += await aws.produce(10)
                    await asyncio.sleep(0.5)
                proxy.plan = FaultPlan()
                await wait_until(lambda: journal.seen(produced), 30, "every record")
    subscriptions = totals(registry, "kclasync_fanout_subscriptions_total")
    print(
        f"\nfan-out: steady {steady}, with cuts {dict(limits.answers)}, "
        f"cuts {proxy.injected['reset_after']}, subscriptions {sum(subscriptions.values())}"
    )
    assert steady == {}
    assert proxy.injected["reset_after"] > 0
    assert set(produced) <= journal.deliveries.keys()
    assert journal.duplicate_causes()["lease_moved"] == 0
