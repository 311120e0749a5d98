"""The Java workers' signs of life, judged on the reader's clock (``java_liveness``)."""

from __future__ import annotations

from kclasync._core.leases.client_version import decode_migration_item, lease_mode
from kclasync._core.leases.lease import Lease
from kclasync._core.workers.java_liveness import JavaLiveness, Verdict
from kclasync._core.workers.worker_metrics import KCLASYNC, WorkerMetrics

FAILOVER = 10.0


def java(worker: str, lut: int) -> WorkerMetrics:
    return WorkerMetrics(worker_id=worker, last_update=lut)


def ours(worker: str, lut: int) -> WorkerMetrics:
    return WorkerMetrics(worker_id=worker, last_update=lut, implementation=KCLASYNC)


def test_an_empty_registry_and_table_are_silent_at_once() -> None:
    judge = JavaLiveness(FAILOVER)
    judge.observe_registry([ours("py-1", 5)], 0.0)
    judge.observe_leases([Lease("s0", 1, "py-1")], {"py-1"}, 0.0)
    assert judge.verdict(0.0) is Verdict.SILENT


def test_an_entry_found_at_the_first_read_proves_nothing_until_it_changes() -> None:
    judge = JavaLiveness(FAILOVER)
    judge.observe_registry([java("java-1", 100)], 0.0)
    assert judge.verdict(0.0) is Verdict.UNKNOWN  # the safe side while it may move
    judge.observe_registry([java("java-1", 100)], 9.0)
    assert judge.verdict(9.0) is Verdict.UNKNOWN
    # An entry alone, no Java-owned lease: a follower holding nothing reports every 30 s by
    # default, so it is given an entry's window (60 s) before it counts as dead.
    judge.observe_registry([java("java-1", 100)], 10.0)
    assert judge.verdict(10.0) is Verdict.UNKNOWN
    judge.observe_registry([java("java-1", 100)], 60.0)
    assert judge.verdict(60.0) is Verdict.SILENT  # dead before this worker started
    judge.observe_registry([java("java-1", 130)], 70.0)
    assert judge.verdict(70.0) is Verdict.ALIVE  # it moved after all
    assert judge.alive_workers(70.0) == {"java-1"}
    # With a Java-owned lease, its counter settles it within one failover time.
    owned = JavaLiveness(FAILOVER)
    owned.observe_registry([java("java-1", 100)], 0.0)
    owned.observe_leases([Lease("s0", 7, "java-1")], set(), 0.0)
    owned.observe_leases([Lease("s0", 7, "java-1")], set(), 10.0)
    assert owned.verdict(9.9) is Verdict.UNKNOWN
    assert owned.verdict(10.0) is Verdict.SILENT


def test_an_entry_that_appears_later_is_a_worker_that_joined() -> None:
    judge = JavaLiveness(FAILOVER)
    judge.observe_registry([], 0.0)
    judge.observe_registry([java("java-1", 100)], 5.0)
    assert judge.verdict(5.0) is Verdict.ALIVE
    # One change seen: two default Java report periods (60 s) before it counts as silent.
    assert judge.verdict(65.0) is Verdict.ALIVE
    assert judge.verdict(65.1) is Verdict.SILENT


def test_the_window_follows_the_observed_report_period() -> None:
    judge = JavaLiveness(FAILOVER)
    judge.observe_registry([java("java-1", 100)], 0.0)
    judge.observe_registry([java("java-1", 102)], 2.0)
    judge.observe_registry([java("java-1", 104)], 6.0)  # a 4 s period
    assert judge.verdict(18.0) is Verdict.ALIVE  # 3 periods: 12 s
    assert judge.verdict(18.1) is Verdict.SILENT
    fast = JavaLiveness(FAILOVER)
    fast.observe_registry([java("java-1", 1)], 0.0)
    fast.observe_registry([java("java-1", 2)], 1.0)
    fast.observe_registry([java("java-1", 3)], 2.0)
    assert fast.verdict(12.0) is Verdict.ALIVE  # never under the failover time
    assert fast.verdict(12.1) is Verdict.SILENT


def test_a_java_owner_renewing_its_leases_is_alive_for_a_failover_time() -> None:
    judge = JavaLiveness(FAILOVER)
    judge.observe_registry([ours("py-1", 1)], 0.0)
    judge.observe_leases([Lease("s0", 7, "java-1"), Lease("s1", 3, "py-1")], {"py-1"}, 0.0)
    assert judge.verdict(0.0) is Verdict.UNKNOWN
    judge.observe_leases([Lease("s0", 8, "java-1"), Lease("s1", 4, "py-1")], {"py-1"}, 3.0)
    assert judge.alive_workers(3.0) == {"java-1"}
    assert judge.verdict(13.0) is Verdict.ALIVE
    assert judge.verdict(13.1) is Verdict.SILENT


def test_counters_of_kclasync_owners_and_new_owners_are_no_sign() -> None:
    judge = JavaLiveness(FAILOVER)
    judge.observe_registry([], 0.0)
    judge.observe_leases([Lease("s0", 1, "py-1"), Lease("s1", 1, "java-1")], {"py-1"}, 0.0)
    # py-1 renewed; s1 changed hands (a take is not the old owner renewing).
    judge.observe_leases([Lease("s0", 2, "py-1"), Lease("s1", 2, "java-2")], {"py-1"}, 1.0)
    assert judge.alive_workers(1.0) == set()


def test_an_entry_removed_from_the_registry_is_forgotten() -> None:
    judge = JavaLiveness(FAILOVER)
    judge.observe_registry([], 0.0)
    judge.observe_registry([java("java-1", 1)], 1.0)
    assert judge.verdict(1.0) is Verdict.ALIVE
    judge.observe_registry([], 2.0)  # a graceful stop removes the entry
    assert judge.verdict(2.0) is Verdict.SILENT


def test_the_lease_mode_on_a_3x_table_follows_the_verdict() -> None:
    state = decode_migration_item({"cv": {"S": "CLIENT_VERSION_3X"}})
    for verdict, assigns in [
        (Verdict.ALIVE, True),
        (Verdict.UNKNOWN, True),
        (Verdict.SILENT, False),
    ]:
        mode = lease_mode(state, configured_leader_based=False, java=verdict)
        assert mode.leader_assigns is assigns, (verdict, mode)
    silent = lease_mode(state, configured_leader_based=False, java=Verdict.SILENT)
    assert "no Java worker shows a sign of life" in silent.reason
    assert lease_mode(state, configured_leader_based=True, java=Verdict.SILENT).leader_assigns
    rollback = decode_migration_item({"cv": {"S": "CLIENT_VERSION_2X"}})
    assert not lease_mode(rollback, configured_leader_based=False).leader_assigns
