"""The leader lock's term: short in a kclasync-only fleet, the configured (Java) one otherwise,
and safe across a switch (the holder stops leading before any reader may take over); and the
successor watch: a bounded set of named workers read it at the short term's pace."""

from __future__ import annotations

from kclasync._core.leases.leader_lock import LeaderLockState, LockAction, LockItem
from kclasync._core.leases.lock_term import (
    SUCCESSORS,
    LockTerm,
    alive_workers,
    lock_interval,
    lock_term,
    other_implementations,
    short_term_failover,
    successors,
    watch_interval,
)
from kclasync._core.workers import worker_metrics as wm

F = 10.0
JAVA = dict(configured_duration=120.0, configured_interval=30.0, failover_time=F)


def entry(worker: str, impl: str | None = wm.KCLASYNC) -> wm.WorkerMetrics:
    return wm.WorkerMetrics(worker_id=worker, last_update=1, implementation=impl)


def test_a_kclasync_only_fleet_writes_one_failover_time_four_times_a_term() -> None:
    assert lock_term(**JAVA, others_present=False) == LockTerm(F, F / 4)


def test_another_implementation_or_an_unread_registry_keeps_the_configured_term() -> None:
    assert lock_term(**JAVA, others_present=True) == LockTerm(120.0, 30.0)
    assert lock_term(**JAVA, others_present=None) == LockTerm(120.0, 30.0)
    off = {**JAVA, "failover_time": None}
    assert lock_term(**off, others_present=False) == LockTerm(120.0, 30.0)  # type: ignore[arg-type]


def test_a_configured_term_shorter_than_the_failover_time_is_kept() -> None:
    term = lock_term(
        configured_duration=6.0, configured_interval=1.0, failover_time=F, others_present=False
    )
    assert term == LockTerm(6.0, 1.0)


def test_readers_pace_themselves_on_the_item_they_saw() -> None:
    assert lock_interval(30.0, 120.0) == 30.0  # a Java leader's item: the KCL's pace
    assert lock_interval(30.0, F) == F / 4
    # A worker that may write the short term keeps its pace, even after a long item.
    assert lock_interval(30.0, 120.0, failover_time=F) == F / 4


def test_java_entries_and_unreadable_entries_count_as_other_implementations() -> None:
    assert not other_implementations([entry("a"), entry("b")])
    assert other_implementations([entry("a"), entry("java-1", impl=None)])
    assert other_implementations([entry("a")], unreadable=1)
    assert not other_implementations([])


def test_the_holder_stops_leading_before_a_reader_may_take_a_short_term_over() -> None:
    """A term switch is a write like any other: the reader starts afresh on the new version,
    with its duration; the holder leads for that duration from when it sent the write."""
    holder, reader = LeaderLockState("a"), LeaderLockState("b")
    long = LockItem("a", "v1", 120.0)
    holder.written(long, sent_at=0.0)
    reader.observe(long, 0.2)
    short = LockItem("a", "v2", F)
    holder.written(short, sent_at=1.0)  # the registry showed no Java worker
    reader.observe(short, 1.3)
    # The holder crashes now. The reader may take over once it saw v2 for longer than F ...
    for t in (5.0, 11.3):
        reader.observe(short, t)
        assert reader.decide(short, t).action is LockAction.WAIT
    reader.observe(short, 11.4)
    assert reader.decide(short, 11.4).action is LockAction.TAKE
    # ... by when the holder had stopped leading (F after it sent v2), whatever it believed.
    assert holder.is_leader(10.9) and not holder.is_leader(11.0)


def test_a_java_worker_appearing_restores_the_long_wait() -> None:
    reader = LeaderLockState("b")
    short = LockItem("a", "v1", F)
    reader.observe(short, 0.0)
    long = LockItem("a", "v2", 120.0)  # the leader saw a Java entry and rewrote the term
    reader.observe(long, 2.0)
    reader.observe(long, 2.0 + 2 * F)
    assert reader.decide(long, 2.0 + 2 * F).action is LockAction.WAIT
    assert reader.seen_duration == 120.0


def test_only_leader_based_workers_with_early_failover_write_the_short_term() -> None:
    assert short_term_failover(F, leader_based=True, early_failover=True) == F
    assert short_term_failover(F, leader_based=True, early_failover=False) is None
    assert short_term_failover(F, leader_based=False, early_failover=True) is None


# The successor watch: a bounded set of fast readers, whatever the fleet's size.


def test_the_holder_names_the_lowest_alive_ids_but_never_itself() -> None:
    assert successors("a", {"a", "d", "b", "c"}, None) == ("b", "c")
    assert successors("a", {"a"}, None) == ()
    assert successors("a", {"a", "b"}, None, count=3) == ("b",)


def test_named_successors_stay_named_while_alive_and_a_dead_one_is_replaced() -> None:
    # Kept in their order, so that they have been reading fast long before they are needed.
    assert successors("a", {"a", "b", "c", "x", "y"}, ("y", "x")) == ("y", "x")
    # "y" died (not alive any more): "x" stays first, the lowest other id fills in.
    assert successors("a", {"a", "b", "c", "x"}, ("y", "x")) == ("x", "b")
    # A new holder drops itself from its predecessor's list.
    assert successors("x", {"a", "b", "x", "y"}, ("x", "y")) == ("y", "a")


def test_only_kclasync_workers_not_suspected_may_be_named() -> None:
    entries = [entry("a"), entry("b"), entry("java-1", impl=None), entry("c")]
    assert alive_workers(entries, suspected={"b"}) == {"a", "c"}


def pace(worker: str, **kw: object) -> float:
    args: dict[str, object] = {
        "configured_interval": 30.0,
        "duration": F,
        "failover_time": F,
        "named": ("b", "c"),
        **kw,
    }
    return watch_interval(worker, **args)  # type: ignore[arg-type]


def test_named_workers_read_fast_the_others_at_the_configured_pace() -> None:
    assert pace("b") == pace("c") == F / 4
    assert pace("d") == 30.0
    # A worker that cannot write the short term reads at the configured pace, named or not.
    assert pace("b", failover_time=None) == 30.0


def test_an_item_naming_nobody_is_read_at_its_own_pace() -> None:
    # A Java KCL leader's 120 s item: every 30 s, as the Java workers do.
    assert pace("d", named=None, duration=120.0) == 30.0
    # A short term naming nobody (an earlier kclasync leader): fast, as before the names.
    assert pace("d", named=None) == F / 4


def test_the_fast_watch_is_bounded_whatever_the_fleet_size() -> None:
    for size in (3, 10, 100, 1000):
        workers = [f"w{i:04d}" for i in range(size)]
        named = successors(workers[0], set(workers), None)
        fast = [w for w in workers[1:] if pace(w, named=named) < 30.0]
        assert len(fast) == min(SUCCESSORS, size - 1)


def test_a_slow_reader_still_waits_a_full_term_after_the_version_it_saw() -> None:
    """The pace decides when a reader notices, never whether it may take over: a reader that
    reads every 30 s an item of 10 s takes it over only when the version it saw stood still
    for 10 s on its own clock."""
    reader = LeaderLockState("d")
    item = LockItem("a", "v1", F, successors=("b", "c"))
    reader.observe(item, 0.0)
    assert reader.seen_successors == ("b", "c")
    assert reader.decide(item, 0.0).action is LockAction.WAIT
    newer = LockItem("a", "v9", F, successors=("b", "c"))  # the holder wrote meanwhile
    reader.observe(newer, 30.0)
    assert reader.decide(newer, 30.0).action is LockAction.WAIT
    reader.observe(newer, 60.0)
    assert reader.decide(newer, 60.0).action is LockAction.TAKE


def test_an_empty_list_keeps_everyone_fast_until_the_holder_read_the_registry() -> None:
    """A new holder names nobody before its first registry read of the term; it may switch to
    the short term at its next write, and whoever it then names must be reading fast."""
    assert pace("d", named=(), duration=120.0) == F / 4
    # Without the short term, the configured pace whatever the list.
    assert pace("d", named=(), duration=120.0, failover_time=None) == 30.0
