"""Balancing, graceful handoff and sticky shards, end to end against moto's server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from kclasync import Consumer
from kclasync.testing.emulators import LocalAws
from tests.support import Aws, Tally, aws_for, stop_all, wait_until

pytestmark = pytest.mark.asyncio


def rounds(consumer: Consumer) -> int:
    """Taking rounds the consumer has completed (0 before it started)."""
    return consumer._coordinator.rounds if consumer._coordinator is not None else 0


async def owners(aws: Aws) -> Counter[str | None]:
    return Counter(lease.owner for lease in (await aws.store.list_leases()).leases)


async def no_handoffs(aws: Aws) -> bool:
    return all(lease.checkpoint_owner is None for lease in (await aws.store.list_leases()).leases)


@contextlib.asynccontextmanager
async def producing(aws: Aws, per_tick: int = 40) -> AsyncIterator[list[int]]:
    """Keep writing records (one PutRecords at a time) until the block ends."""
    produced: list[int] = []
    stop = asyncio.Event()

    async def run() -> None:
        while not stop.is_set():
            produced.extend(await aws.produce(per_tick))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)

    task = asyncio.create_task(run())
    try:
        yield produced
    finally:
        stop.set()
        await task


@contextlib.asynccontextmanager
async def running(*consumers: Consumer) -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks = [asyncio.create_task(c.run()) for c in consumers]
    try:
        yield tasks
    finally:
        await stop_all(consumers, tasks)


async def test_scale_out_one_to_four_balances_in_one_round_without_duplicates(
    moto: LocalAws, unique_name: str
) -> None:
    # The KCL's default failover time: renewals (every failover / 3) may then run some 6 s late,
    # as on a loaded machine, before a lease lapses. The protocol's bounds below are multiples
    # of it, counted from the event that starts them; start-up and draining are plain I/O.
    failover = 10.0
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(16)
        first = await aws.produce(800)
        tally = Tally()
        w1 = aws.consumer(tally.handler("w1"), worker_id="w1", failover_time=failover)
        new = [
            aws.consumer(tally.handler(f"w{i}"), worker_id=f"w{i}", failover_time=failover)
            for i in (2, 3, 4)
        ]
        async with running(w1):
            await wait_until(lambda: len(w1.held_leases) == 16, 60, "w1 to hold all 16")
            await wait_until(lambda: tally.seen(first), 120, "the backlog")
            async with producing(aws) as produced, running(*new):
                await wait_until(
                    lambda: all(c.health["running"] for c in new), 60, "the new workers to start"
                )
                # Each started worker waits at most 1 s to see the others, then scans once.
                await wait_until(
                    lambda: all(rounds(c) >= 1 for c in new),
                    2 * failover,
                    "one taking round by each new worker",
                )
                # After one round each: 4 leases per worker (handoffs may still be finishing).
                assert sorted((await owners(aws)).values()) == [4, 4, 4, 4]
                # The old owner sees a handoff at its next renewal and finishes its batch; the
                # new owner starts the lease at its own next renewal.
                await wait_until(lambda: no_handoffs(aws), 2 * failover, "every handoff to finish")
                assert sorted(len(c.held_leases) for c in [w1, *new]) == [4, 4, 4, 4]
                # Records keep flowing through all four workers.
                mark = len(produced)
                await wait_until(lambda: len(produced) > mark + 400, 60, "more records")
                await wait_until(lambda: tally.seen(produced[: mark + 400]), 120, "them consumed")
            await wait_until(lambda: tally.seen(produced), 120, "everything produced")
        assert tally.duplicates == 0
        assert all(tally.by_worker.get(f"w{i}") for i in (2, 3, 4))


async def test_graceful_stop_hands_over_within_one_round(moto: LocalAws, unique_name: str) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(4)
        tally = Tally()
        a = aws.consumer(tally.handler("a"), worker_id="a", failover_time=10.0)
        b = aws.consumer(tally.handler("b"), worker_id="b", failover_time=10.0)
        async with running(a, b):
            async with producing(aws) as produced:
                await wait_until(
                    lambda: len(a.held_leases) == 2 and len(b.held_leases) == 2, 30, "a 2/2 split"
                )
                await wait_until(lambda: no_handoffs(aws), 20, "the initial handoffs")
                await a.stop()
                loop = asyncio.get_running_loop()
                stopped = loop.time()
                took = await wait_until(lambda: len(b.held_leases) == 4, 30, "b to take a's leases")
                # One taking round (failover + epsilon), far below the 10 s expiry path.
                assert loop.time() - stopped <= b.config.taker_interval + 1.0
                assert took < b.config.failover_time
            await wait_until(lambda: tally.seen(produced), 30, "everything produced")
        assert tally.duplicates == 0


async def test_rolling_restart_loses_and_duplicates_nothing(
    moto: LocalAws, unique_name: str
) -> None:
    # Graceful restarts lose no lease and duplicate nothing as long as renewals are on time: the
    # KCL's default failover time (10 s) lets them run some 6 s late, as on a loaded machine; at
    # 2 s a stalled event loop loses leases mid-batch and the next owner reads the batch again.
    failover = 10.0
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(6)
        tally = Tally()
        workers = {
            name: aws.consumer(tally.handler(name), worker_id=name, failover_time=failover)
            for name in "abc"
        }
        tasks = {name: asyncio.create_task(c.run()) for name, c in workers.items()}
        try:
            async with producing(aws) as produced:
                for generation, name in enumerate("abc"):
                    await wait_until(
                        lambda: sorted(len(c.held_leases) for c in workers.values()) == [2, 2, 2],
                        30,
                        f"balance before restarting {name}",
                    )
                    await workers[name].stop()
                    await tasks.pop(name)
                    fresh = f"{name}{generation + 1}"
                    workers.pop(name)
                    workers[fresh] = aws.consumer(
                        tally.handler(fresh), worker_id=fresh, failover_time=failover
                    )
                    tasks[fresh] = asyncio.create_task(workers[fresh].run())
                await wait_until(
                    lambda: sorted(len(c.held_leases) for c in workers.values()) == [2, 2, 2],
                    30,
                    "balance after the last restart",
                )
            await wait_until(lambda: tally.seen(produced), 30, "everything produced")
        finally:
            await stop_all(list(workers.values()), list(tasks.values()))
        assert tally.duplicates == 0
        assert len(tally.deliveries) == len(produced)


# -- sticky shards (seed 004), one behaviour per test ------------------------------------------

#: The tests below count taking rounds (what a pin holds over them), not their period: a round
#: every second instead of the default 2 x (failover + epsilon) with early failover.
QUICK_ROUNDS = {"lease_taker_interval": 1.0}


async def test_pinned_lease_is_not_stolen_and_stays_renewed_by_its_owner(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(4)
        tally = Tally()
        a = aws.consumer(tally.handler("a"), worker_id="a")
        async with running(a):
            await wait_until(lambda: len(a.held_leases) == 4, 20, "a to hold all 4")
            pinned = a.held_leases[:3]
            for key in pinned:
                await aws.store.set_sticky(key, 10)
            before = {k: (await aws.store.get_lease(k)).counter for k in pinned}  # type: ignore[union-attr]
            b = aws.consumer(tally.handler("b"), worker_id="b", **QUICK_ROUNDS)
            async with running(b):
                await wait_until(lambda: rounds(b) >= 2, 20, "two rounds by b")
                await wait_until(lambda: no_handoffs(aws), 20, "handoffs to finish")
                # b may only get the one unpinned lease; a keeps and renews its pinned ones.
                assert set(a.held_leases) == set(pinned)
                assert len(b.held_leases) == 1 and b.held_leases[0] not in pinned
                for key in pinned:
                    lease = await aws.store.get_lease(key)
                    assert lease is not None and lease.owner == "a"
                    assert lease.counter > before[key]


async def test_unowned_pinned_lease_is_assigned(moto: LocalAws, unique_name: str) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        ids = await aws.produce(100)
        tally = Tally()
        setup = aws.consumer(tally.handler("setup"))
        await aws.store.ensure_table()
        await setup._sync_shards()
        keys = sorted(lease.key for lease in (await aws.store.list_leases()).leases)
        await aws.store.set_sticky(keys[0], 10)
        a = aws.consumer(tally.handler("a"), worker_id="a")
        async with running(a):
            await wait_until(lambda: tally.seen(ids), 20, "both shards, pinned one included")
            assert a.held_leases == keys


async def test_pin_to_a_named_worker_moves_the_lease_there(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        tally = Tally()
        a = aws.consumer(tally.handler("a"), worker_id="a")
        b = aws.consumer(tally.handler("b"), worker_id="b")
        async with running(a):
            await wait_until(lambda: len(a.held_leases) == 2, 20, "a to hold both")
            async with running(b):
                async with producing(aws) as produced:
                    await wait_until(lambda: len(b.held_leases) == 1, 20, "b's share")
                    await wait_until(lambda: no_handoffs(aws), 20, "the handoff")
                    (key,) = a.held_leases
                    await aws.store.set_sticky(key, 10, worker="b")
                    # a finishes its batch, checkpoints and releases it; only b may take it.
                    await wait_until(lambda: key in b.held_leases, 20, "the pinned lease at b")
                    await wait_until(lambda: no_handoffs(aws), 20, "any rebalancing")
                    assert key not in a.held_leases
                    lease = await aws.store.get_lease(key)
                    assert lease is not None and lease.owner == "b"
                await wait_until(lambda: tally.seen(produced), 30, "everything produced")
        assert tally.duplicates == 0


async def test_sticky_release_checkpoints_releases_and_parks_the_lease(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        tally = Tally()
        a = aws.consumer(tally.handler("a"), worker_id="a", **QUICK_ROUNDS)
        b = aws.consumer(tally.handler("b"), worker_id="b", **QUICK_ROUNDS)
        async with running(a, b):
            async with producing(aws) as produced:
                await wait_until(
                    lambda: len(a.held_leases) == 1 and len(b.held_leases) == 1, 20, "a 1/1 split"
                )
                (key,) = a.held_leases
                await aws.store.set_sticky(key, 20)
                await wait_until(lambda: a.held_leases == [], 20, "a to release it")
                parked = await aws.store.get_lease(key)
                assert parked is not None and parked.owner is None
                assert parked.checkpoint.value == tally.last_seq[key]  # progress was saved
                start = rounds(b)
                await wait_until(lambda: rounds(b) >= start + 2, 20, "two more rounds")
                assert key not in a.held_leases + b.held_leases  # nobody takes it while Sticky=20
                assert (await aws.store.get_lease(key)).owner is None  # type: ignore[union-attr]
                await aws.store.set_sticky(key, None)
                await wait_until(lambda: key in a.held_leases + b.held_leases, 20, "it to be taken")
            await wait_until(lambda: tally.seen(produced), 30, "everything produced")
        assert tally.duplicates == 0


async def test_pinned_lease_of_a_crashed_worker_waits_until_unpinned(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        tally = Tally()
        a = aws.consumer(tally.handler("a"), worker_id="a", failover_time=1.0)
        task = asyncio.create_task(a.run())
        await wait_until(lambda: len(a.held_leases) == 2, 20, "a to hold both")
        pinned, other = a.held_leases
        await aws.store.set_sticky(pinned, 10)
        await wait_until(lambda: rounds(a) >= 1, 10, "a to see the pin")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        b = aws.consumer(
            tally.handler("b"), worker_id="b", failover_time=1.0, lease_taker_interval=0.5
        )
        async with running(b):
            await wait_until(lambda: other in b.held_leases, 20, "the unpinned lease")
            start = rounds(b)
            await wait_until(lambda: rounds(b) >= start + 3, 20, "three more rounds")
            assert pinned not in b.held_leases  # no automatic failover for sticky shards
            await aws.store.set_sticky(pinned, 0)
            await wait_until(lambda: pinned in b.held_leases, 20, "the unpinned lease")


async def test_unknown_sticky_values_are_logged_once_and_treated_as_normal(
    moto: LocalAws, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        ids = await aws.produce(100)
        tally = Tally()
        setup = aws.consumer(tally.handler("setup"))
        await aws.store.ensure_table()
        await setup._sync_shards()
        keys = sorted(lease.key for lease in (await aws.store.list_leases()).leases)
        await aws.store.set_sticky(keys[0], 7)
        await aws.dynamodb.update_item(
            TableName=aws.name,
            Key={"leaseKey": {"S": keys[1]}},
            UpdateExpression="SET Sticky = :s",
            ExpressionAttributeValues={":s": {"S": "pinned please"}},
        )
        caplog.set_level(logging.WARNING, logger="kclasync.leases")
        a = aws.consumer(tally.handler("a"), worker_id="a", **QUICK_ROUNDS)
        async with running(a):
            await wait_until(lambda: tally.seen(ids), 20, "both shards")
            await wait_until(lambda: rounds(a) >= 3, 20, "several rounds")
        warnings = [r.getMessage() for r in caplog.records if "unknown Sticky" in r.getMessage()]
        assert sorted(w.split()[1] for w in warnings) == keys  # once per lease, not per round
