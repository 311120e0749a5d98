"""The worker registry on moto's DynamoDB (and its in-memory twin), in the KCL 3.x
``<app>-WorkerMetricStats`` layout, and the removal of earlier kclasync registry items."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync._adapters.memory_worker_metrics import MemoryWorkerMetrics
from kclasync._adapters.worker_metrics_table import (
    DynamoWorkerMetrics,
    remove_legacy_registry_items,
)
from kclasync._adapters.worker_registry import WorkerRegistry, worker_metrics_table_name
from kclasync._core.leases.lease import Lease
from kclasync._core.workers import worker_metrics as wm
from kclasync.testing.emulators import LocalAws

pytestmark = pytest.mark.asyncio


async def registry_contract(registry: WorkerRegistry) -> None:
    await registry.ensure_table()
    await registry.ensure_table()  # idempotent
    a = wm.WorkerMetrics("a", 1000).with_sample(wm.CPU, 12.5)
    await registry.report(a)
    await registry.report(wm.WorkerMetrics("b", 1001))
    a2 = a.with_sample(wm.CPU, 20.0).reported_at(1030)
    await registry.report(a2)
    listed = await registry.list_workers()
    assert sorted(listed.entries, key=lambda e: e.worker_id) == [a2, wm.WorkerMetrics("b", 1001)]
    assert listed.corrupt == ()
    # The capacity (kclasync's extra ``cap`` attribute) is written, and dropped once unknown.
    # So is the CPU count (``cor``).
    await registry.report(
        attrs.evolve(wm.WorkerMetrics("c", 1002), capacity_kbps=1500.0, cores=2.5)
    )
    entries = {e.worker_id: e for e in (await registry.list_workers()).entries}
    assert entries["c"].capacity_kbps == 1500.0 and entries["c"].cores == 2.5
    await registry.report(wm.WorkerMetrics("c", 1003))
    entries = {e.worker_id: e for e in (await registry.list_workers()).entries}
    assert entries["c"].capacity_kbps is None and entries["c"].cores is None
    await registry.remove("c")
    await registry.remove("a")
    await registry.remove("a")  # already gone: fine
    assert [e.worker_id for e in (await registry.list_workers()).entries] == ["b"]
    # A dead worker's entry is removed only while its heartbeat is the one judged silent.
    beating = attrs.evolve(wm.WorkerMetrics("d", 1004), heartbeat=7, heartbeat_interval=0.5)
    await registry.report(beating)
    await registry.report(attrs.evolve(beating, heartbeat=8))  # it wrote again
    assert await registry.remove("d", heartbeat=7) is False
    assert await registry.remove("b", heartbeat=8) is False  # no heartbeat at all
    assert await registry.remove("d", heartbeat=8) is True
    assert await registry.remove("d", heartbeat=8) is False  # already gone
    assert [e.worker_id for e in (await registry.list_workers()).entries] == ["b"]
    # One entry read alone; the leader's silence digest is written, and dropped with its
    # leadership (a report without it).
    assert await registry.get("b") == wm.WorkerMetrics("b", 1001)
    assert await registry.get("nobody") is None
    leader = attrs.evolve(beating, digest=wm.SilenceDigest({"x": 3}, 2))
    await registry.report(leader)
    assert await registry.get("d") == leader
    await registry.report(beating)
    got = await registry.get("d")
    assert got is not None and got.digest is None and got.heartbeat == beating.heartbeat
    await registry.remove("d")


async def test_memory_registry() -> None:
    registry = MemoryWorkerMetrics()
    await registry_contract(registry)
    registry.items["bad"] = {"wid": {"S": "bad"}}
    assert len((await registry.shared().list_workers()).corrupt) == 1


async def test_dynamodb_registry(moto: LocalAws, unique_name: str) -> None:
    async with moto.client_options().create_client("dynamodb") as ddb:
        table = worker_metrics_table_name(unique_name)
        assert table == f"{unique_name}-WorkerMetricStats"
        registry = DynamoWorkerMetrics(ddb, table)
        await registry_contract(registry)
        desc = (await ddb.describe_table(TableName=table))["Table"]
        assert desc["KeySchema"] == [{"AttributeName": "wid", "KeyType": "HASH"}]
        assert desc["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
        # Attributes a newer KCL adds survive our reports; corrupt items are skipped, counted.
        await ddb.update_item(
            TableName=table,
            Key={"wid": {"S": "b"}},
            UpdateExpression="SET sup = :s",
            ExpressionAttributeValues={":s": {"N": "1"}},
        )
        await registry.report(wm.WorkerMetrics("b", 1100))
        await ddb.put_item(TableName=table, Item={"wid": {"S": "broken"}, "lut": {"S": "x"}})
        listed = await registry.list_workers()
        assert [(e.worker_id, e.support_code) for e in listed.entries] == [("b", 1)]
        assert [e.worker_id for e in listed.corrupt] == ["broken"]
        assert registry.corrupt_seen == 1


async def test_legacy_registry_items_are_removed_from_the_lease_table(
    moto: LocalAws, unique_name: str
) -> None:
    async with moto.client_options().create_client("dynamodb") as ddb:
        store = DynamoLeaseStore(ddb, unique_name)
        await store.ensure_table()
        await store.create_lease(Lease(key="shardId-000000000000"))
        for old in ("old-a", "old-b"):  # what earlier versions wrote
            legacy: dict[str, Any] = {
                "leaseKey": {"S": f"__worker__:{old}"},
                "entityType": {"S": "WORKER"},
                "heartbeat": {"N": "3"},
            }
            await ddb.put_item(TableName=unique_name, Item=legacy)
        # A lease whose key merely starts with the prefix would not be touched.
        odd: dict[str, Any] = {"leaseKey": {"S": "__worker__:lease"}, "leaseCounter": {"N": "1"}}
        await ddb.put_item(TableName=unique_name, Item=odd)
        removed = await remove_legacy_registry_items(ddb, unique_name)
        assert removed == ["__worker__:old-a", "__worker__:old-b"]
        keys = sorted(i["leaseKey"]["S"] for i in (await ddb.scan(TableName=unique_name))["Items"])
        assert keys == ["__worker__:lease", "shardId-000000000000"]
        assert await remove_legacy_registry_items(ddb, unique_name) == []
