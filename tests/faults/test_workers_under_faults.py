"""Workers on the emulators through the fault proxy: faults on DynamoDB only, then on Kinesis
only, then on both, while a producer writes.

What must hold: no record lost; no lease lost (every worker stays alive and the table reachable,
at the default failover time of 10 s: a fault delays a request by at most 2 s, but with
botocore's own retries one call is up to three requests and their backoff, and a renewal can
wait behind a checkpoint of the same lease, so at 6 s a run of faulty requests on one lease
occasionally outlasted the failover time: the worker then rightly gave the lease up); a renewal or
checkpoint whose reply was lost never makes two owners (no two workers process a shard at the
same time or take turns on it, the held-lease views never overlap); no stack trace in the logs;
and the retries show in ``kclasync_aws_retries_total``. The numbers are printed (``-s``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from kclasync.testing.emulators import LocalAws
from kclasync.testing.fault_proxy import Fault, FaultKind, FaultPlan, FaultProxy
from tests.faults.fleet import Journal, LeaseWatch, botocore_options, running, totals
from tests.support import aws_for, wait_until

pytestmark = pytest.mark.asyncio

FAILOVER = 10.0
RATE = 0.15  # the share of requests of the service under faults that meet a breaking fault
LATENCY = 0.1  # the share that are delayed (0-2 s)


def _plan(service: str | None) -> FaultPlan:
    return FaultPlan.mixed(RATE, service=service, latency=LATENCY, max_latency=2.0)


async def _produce(aws: object, stop: asyncio.Event, produced: list[int], per_tick: int) -> None:
    while not stop.is_set():
        produced += await aws.produce(per_tick)  # type: ignore[attr-defined]
        await asyncio.sleep(0.1)


async def _run(
    local: LocalAws,
    name: str,
    phases: list[tuple[str, FaultPlan, float]],
    caplog: pytest.LogCaptureFixture,
    *,
    shards: int = 6,
    workers: int = 3,
    per_tick: int = 10,
    sdk_retries: int = 3,
) -> None:
    caplog.set_level(logging.INFO, logger="kclasync")
    upstreams = {"dynamodb": local.endpoint_url}
    upstreams["kinesis"] = local.kinesis_endpoint_url or local.endpoint_url
    journal = Journal()
    registry = CollectorRegistry()
    proxy = FaultProxy(upstreams, seed=24)
    async with aws_for(local, name) as aws, proxy as url:
        proxy_options = botocore_options(url, max_attempts=sdk_retries)
        await aws.create_stream(shards)
        produced: list[int] = []
        stop = asyncio.Event()
        producing = asyncio.create_task(_produce(aws, stop, produced, per_tick))
        async with running(
            proxy_options, name, journal, workers, registry, failover_time=FAILOVER
        ) as fleet:
            watch = LeaseWatch(aws.store, fleet)
            watching = asyncio.create_task(watch.run())
            # Warm-up: every shard held, each worker holding its share, records flowing.
            await wait_until(
                lambda: (
                    sum(len(w.held_leases) for w in fleet) == shards
                    and all(len(w.held_leases) == shards // workers for w in fleet)
                    and len(journal.deliveries) > 0
                ),
                40,
                "the fleet to balance",
            )
            watch.counting = True
            warm = asyncio.get_running_loop().time()
            lost_in_warm_up = totals(registry, "kclasync_leases_lost_total")
            for _, plan, seconds in phases:
                proxy.plan = plan
                await asyncio.sleep(seconds)  # the phase's length (not a synchronisation)
            proxy.plan = FaultPlan()
            stop.set()
            await producing
            await wait_until(lambda: journal.seen(produced), 60, "every record to be processed")
            watching.cancel()
    injected = dict(proxy.injected)
    retries = totals(registry, "kclasync_aws_retries_total", "layer", "service", "code")
    renewals = totals(registry, "kclasync_lease_renewals_total")
    renewal_failures = totals(registry, "kclasync_lease_renewal_failures_total", "reason")
    lost = totals(registry, "kclasync_leases_lost_total")
    lost.subtract(lost_in_warm_up)
    lost_after = [e for e in journal.lost if e[0] >= warm]
    duplicates = journal.duplicate_causes()
    print(
        f"\n{name}: produced {len(produced)}, faults injected {injected}\n"
        f"  retries by (layer, service, code): {dict(retries)}\n"
        f"  leases moved after warm-up: {len(watch.moves)}, leases lost: {sum(lost.values())}, "
        f"duplicates by cause: {dict(duplicates)}\n"
        f"  renewals {sum(renewals.values())}, failed renewals {dict(renewal_failures)}"
    )
    assert set(produced) <= journal.deliveries.keys(), "records lost"
    assert sum(lost.values()) == 0, f"leases lost: {lost_after}"
    assert not lost_after, lost_after
    assert not watch.moves, (
        f"leases moved although every worker was alive: {watch.moves}, warm-up ended {warm}"
    )
    assert not watch.view_overlaps, watch.view_overlaps[:5]
    assert not journal.two_owner_violations(), journal.two_owner_violations()[:5]
    assert duplicates["lease_moved"] == duplicates["same_worker"] == 0, duplicates
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info], "a log record carries a stack trace"
    # Every kind of fault happened, and the retries show in the metrics.
    for kind in ("latency", "reset_before", "reset_after", "half_close", "truncate"):
        assert injected.get(kind, 0) > 0, kind
    for kind in ("http_500", "http_503", "throttle"):
        assert injected.get(kind, 0) > 0, kind
    by_service: Counter[str] = Counter()
    for (_, service, _), n in retries.items():
        by_service[service] += n
    services = {s for _, p, _ in phases for f in p.faults for s in [f.service]}
    for service in ("dynamodb", "kinesis"):
        if service in services or None in services:
            assert by_service[service] > 0, f"no {service} retry counted"


async def test_faults_on_dynamodb_then_kinesis_then_both(
    moto: LocalAws, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    phases = [
        ("DynamoDB faults", _plan("dynamodb"), 10.0),
        ("Kinesis faults", _plan("kinesis"), 10.0),
        ("faults on both", _plan(None), 10.0),
    ]
    await _run(moto, unique_name, phases, caplog)


async def test_faults_on_both_with_kinesis_local(
    kinesis: LocalAws, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No retries in botocore: every fault reaches the runtime's retries and reconciliations,
    and one lease write in ten loses its reply after it was applied."""
    lost_replies = FaultPlan(
        (Fault(FaultKind.RESET_AFTER, 0.1, "dynamodb", frozenset({"UpdateItem"})),)
    )
    phases = [("faults on both", _plan(None) + lost_replies, 12.0)]
    await _run(kinesis, unique_name, phases, caplog, shards=3, sdk_retries=0)
