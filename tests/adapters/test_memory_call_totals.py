"""The in-memory tables count the whole fleet's calls and items read (for cost estimates)."""

from __future__ import annotations

from kclasync._adapters.memory import MemoryCoordinatorState, MemoryLeaseStore, MemoryLeaseTable
from kclasync._core.leases.lease import Lease
from kclasync._core.workers.worker_metrics import WorkerMetrics


async def test_registry_views_share_fleet_totals_and_count_entries_read() -> None:
    table = MemoryLeaseTable()
    a = MemoryLeaseStore(table).worker_registry()
    b = MemoryLeaseStore(table).worker_registry()
    await a.report(WorkerMetrics(worker_id="a", last_update=1))
    await b.report(WorkerMetrics(worker_id="b", last_update=1))
    await b.report(WorkerMetrics(worker_id="b", last_update=2))
    await a.list_workers()
    assert a.calls == {"report": 1, "list_workers": 1}
    assert b.calls == {"report": 2}
    totals = table.worker_metrics.totals
    assert totals["report"] == 3 and totals["list_workers"] == 1
    assert totals["items_read"] == 2  # two entries in the one scan


async def test_coordinator_views_share_fleet_totals() -> None:
    locks = MemoryCoordinatorState()
    one, two = locks.shared(), locks.shared()
    await one.create_lock("leader", "w1", 30.0, "v1")
    await two.get_lock("leader")
    await two.get_lock("leader")
    assert one.calls == {"create_lock": 1} and two.calls == {"get_lock": 2}
    assert locks.totals == {"create_lock": 1, "get_lock": 2}


async def test_lease_table_counts_items_read_by_scan_and_owner_index() -> None:
    table = MemoryLeaseTable()
    store = MemoryLeaseStore(table)
    for i in range(3):
        store.put_raw(f"s{i}", Lease(key=f"s{i}", owner="w1" if i else "w2"))
    await store.list_leases()
    await store.lease_keys_of("w1")
    assert table.items_read == {"list_leases": 3, "lease_keys_of": 2}
