"""The leader's silence digest: what it publishes, how a follower reads it, and its codec."""

from __future__ import annotations

import asyncio

from kclasync._adapters.memory_worker_metrics import MemoryWorkerMetrics
from kclasync._core.leases.lease import Lease
from kclasync._core.workers import worker_metrics as wm
from kclasync._core.workers import worker_metrics_item as wi
from kclasync._core.workers.silence_digest import (
    DigestView,
    follow,
    full_view_restart_wakes,
    publish,
)
from kclasync._core.workers.worker_silence import HeartbeatView, watch_heartbeats


def entry(worker: str, beat: int, digest: wm.SilenceDigest | None = None) -> wm.WorkerMetrics:
    return wm.WorkerMetrics(
        worker_id=worker,
        last_update=0,
        heartbeat=beat,
        heartbeat_interval=0.5,
        implementation=wm.KCLASYNC,
        digest=digest,
    )


def test_the_leader_publishes_silent_workers_worth_following_and_counts_joins() -> None:
    view = HeartbeatView()
    digest = None
    reads = [
        [entry("a", 1), entry("b", 1)],
        [entry("a", 2), entry("b", 2), entry("c", 1)],  # c joined
        [entry("a", 3), entry("b", 2), entry("c", 2)],
        [entry("a", 4), entry("b", 2), entry("c", 3)],
        [entry("a", 5), entry("b", 2), entry("c", 4)],  # b silent: 2 periods still
    ]
    published = []
    for step, entries in enumerate(reads):
        change = watch_heartbeats(view, entries, "leader", step * 0.5)
        view = change.view
        digest = publish(view, change, [], digest)
        published.append(digest)
    assert [d.members for d in published] == [0, 1, 1, 1, 1]
    assert published[-2].silent == {}
    assert published[-1].silent == {"b": 2}  # it moved under the leader's watch
    assert published[2] is published[1]  # unchanged: the same value
    # A worker dead before the leader watched it, owning nothing: not worth following.
    fresh = HeartbeatView()
    for step in range(5):
        change = watch_heartbeats(fresh, [entry("d", 7)], "leader", step * 0.5)
        fresh = change.view
    assert fresh.silent_workers() == {"d"}
    assert publish(fresh, change, [], None).silent == {}
    assert publish(fresh, change, [Lease("s0", 3, "d")], None).silent == {"d": 7}


def test_a_follower_acts_once_per_silence_and_wakes_on_membership() -> None:
    view = DigestView()
    d0 = wm.SilenceDigest({}, 0)
    change = follow(view, "L", entry("L", 1, d0), "me", 0.0)
    assert change.silent == frozenset() and not change.wake
    d1 = wm.SilenceDigest({"x": 4}, 0)
    change = follow(change.view, "L", entry("L", 2, d1), "me", 0.25)
    assert change.silent == {"x"}
    change = follow(change.view, "L", entry("L", 3, d1), "me", 0.5)
    assert change.silent == frozenset()  # acted on already
    d2 = wm.SilenceDigest({"x": 4, "me": 9}, 1)  # a join or a leave; and this worker named
    change = follow(change.view, "L", entry("L", 4, d2), "me", 0.75)
    assert change.silent == frozenset() and change.wake
    # x came back (gone from the digest), then went silent again at another value.
    change = follow(change.view, "L", entry("L", 5, wm.SilenceDigest({}, 1)), "me", 1.0)
    d3 = wm.SilenceDigest({"x": 11}, 1)
    change = follow(change.view, "L", entry("L", 6, d3), "me", 1.25)
    assert change.silent == {"x"} and not change.wake


def test_a_silent_leader_is_followed_and_hands_back_to_full_reads() -> None:
    d = wm.SilenceDigest({}, 0)
    change = follow(DigestView(), "L", entry("L", 1, d), "me", 0.0)
    change = follow(change.view, "L", entry("L", 2, d), "me", 0.25)
    for step in range(2, 8):
        change = follow(change.view, "L", entry("L", 2, d), "me", step * 0.25)
        if change.leader_silent:
            break
    assert change.leader_silent and change.silent == {"L"}
    # A new leader: a fresh view (its first digest is read as a first read).
    change = follow(change.view, "M", entry("M", 1, wm.SilenceDigest({"L": 2}, 5)), "me", 2.0)
    assert change.view.leader == "M" and change.silent == {"L"} and not change.wake


def test_the_digest_round_trips_and_a_report_without_one_removes_it() -> None:
    with_digest = entry("L", 3, wm.SilenceDigest({"b": 2, "c": 9}, 4))
    item = wi.encode_item(with_digest)
    assert item[wi.SILENT] == {"M": {"b": {"N": "2"}, "c": {"N": "9"}}}
    assert wi.decode_item(item) == with_digest
    broken = {**item, wi.MEMBERS: {"S": "x"}}
    assert wi.decode_item(broken).digest is None  # advisory: unreadable means none

    async def go() -> None:
        registry = MemoryWorkerMetrics()
        await registry.report(with_digest)
        assert (await registry.get("L")) == with_digest
        await registry.report(entry("L", 4))  # no longer the leader
        got = await registry.get("L")
        assert got is not None and got.digest is None
        assert await registry.get("nobody") is None

    asyncio.run(go())


def test_going_back_to_full_reads_after_a_digest_wakes_the_taker_once() -> None:
    """A leader that stopped gracefully released its leases and deleted its entry; the
    follower's fresh view of the registry cannot show that leave, so it wakes its taker when
    it goes back to full reads, if it was reading a leader's digest (not from the start, nor
    under a leader that publishes none)."""
    assert not full_view_restart_wakes(DigestView())
    change = follow(DigestView(), "L", entry("L", 1, wm.SilenceDigest({}, 0)), "me", 0.0)
    assert full_view_restart_wakes(change.view)
