"""Shared helpers of the in-memory adapter tests: a hand-moved loop clock and lease set-up."""

from __future__ import annotations

import random

from kclasync._adapters.memory import FaultPlan, MemoryLeaseStore, OpFaults
from kclasync._adapters.protocols import IteratorType, StartingPosition
from kclasync._core.leases.lease import Lease

KEY = "shardId-000000000000"


class FakeClock:
    """Replaces the running loop's clock so tests can move time by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def owned(store: MemoryLeaseStore, owner: str = "w1", key: str = KEY) -> Lease:
    assert await store.create_lease(Lease(key))
    taken = await store.take_lease(Lease(key), owner)
    assert taken is not None
    return taken


TRIM = StartingPosition(IteratorType.TRIM_HORIZON)
LATEST_POS = StartingPosition(IteratorType.LATEST)


def plan(seed: int = 1, **ops: OpFaults) -> FaultPlan:
    return FaultPlan(random.Random(seed), operations=dict(ops))
