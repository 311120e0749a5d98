"""Leader-based assignment (``lease_taker="load"``) end to end against moto's server: the leader
assigns, the others find their leases through the owner index, and moves are graceful."""

from __future__ import annotations

import pytest

from kclasync.testing.emulators import LocalAws
from tests.e2e.test_balancing import no_handoffs, owners, producing, running
from tests.support import Tally, aws_for, wait_until

pytestmark = pytest.mark.asyncio

LOAD = {"lease_taker": "load", "assignment_interval": 1.0, "leader_heartbeat_interval": 1.0}


async def test_leader_spreads_leases_by_index_discovery_and_graceful_moves(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(6)
        first = await aws.produce(300)
        tally = Tally()
        w1 = aws.consumer(tally.handler("w1"), worker_id="w1", **LOAD)
        new = [aws.consumer(tally.handler(f"w{i}"), worker_id=f"w{i}", **LOAD) for i in (2, 3)]
        async with running(w1):
            await wait_until(lambda: len(w1.held_leases) == 6, 30, "the leader to hold all 6")
            await wait_until(lambda: tally.seen(first), 30, "the backlog")
            async with producing(aws) as produced, running(*new):
                await wait_until(
                    lambda: all(len(c.held_leases) == 2 for c in [w1, *new]),
                    30,
                    "two leases per worker",
                )
                await wait_until(lambda: no_handoffs(aws), 20, "every handoff to finish")
                assert sorted((await owners(aws)).values()) == [2, 2, 2]
                mark = len(produced)
                await wait_until(lambda: len(produced) > mark + 200, 20, "more records")
            await wait_until(lambda: tally.seen(produced), 30, "everything produced")
        # Planned moves are graceful: nothing was processed twice.
        assert tally.duplicates == 0
        # Only the leader scanned the table; the others queried the owner index.
        for c in new:
            calls = c._store.calls if c._store is not None else {}  # type: ignore[attr-defined]
            assert calls.get("query", 0) > 0
            assert calls.get("scan", 0) <= 2, calls  # the start-up shard sync only
