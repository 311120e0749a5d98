"""Which shards of a planning the Spark source's driver asks before planning a batch.

Owns: running the probes of one planning (``kclasync.spark.fetch.has_new_records``, passed in)
with bounded concurrency, and the first planning's early stop: once one probe of a query's
first planning found records, the batch runs anyway, so the shards not yet asked are planned
unasked (their reads find out for themselves, on the executors, alongside the other reads).
Must not: talk to AWS itself, import pyspark, or decide quotas (``kclasync.spark.offsets``).

Also owns taking the unasked shards' iterators (``take_iterators``): the driver starts this
as the first planning returns, so that it runs while Spark commits the plan and launches the
tasks, and hands them to the tasks (``KinesisStreamReader.partitions``), whose first GetRecords
then goes out at once.

Calls: at most one probe (a GetShardIterator and a 2-record GetRecords) per shard and planning,
as before; with the early stop a query's first planning over a stream with records asks
``FIRST_WAVE`` shards instead of all of them. What the early stop costs: a shard planned
unasked that holds nothing is read empty by its task and gets a progress record (one
conditional PutItem), once per query, not per batch. ``take_iterators`` makes one
GetShardIterator per unasked shard, which the shard's read would otherwise make itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Sequence

__all__ = [
    "EARLY_WAIT",
    "FIRST_WAVE",
    "MAX_CONCURRENT",
    "EarlyIterators",
    "probe_shards",
    "take_iterators",
]

#: Probes in flight at once: the driver's Kinesis client's connection pool
#: (``ClientOptions.max_pool_connections``); more would only queue in the client.
MAX_CONCURRENT = 64

#: Shards a query's first planning asks before it may stop asking (``probe_shards``).
FIRST_WAVE = 8

#: Seconds the planning waits for the unasked shards' iterators before going on without them.
EARLY_WAIT = 10.0


async def probe_shards(
    shard_ids: Sequence[str],
    probe: Callable[[str], Awaitable[bool]],
    *,
    early_stop: bool = False,
    limit: int = MAX_CONCURRENT,
    first_wave: int = FIRST_WAVE,
) -> dict[str, bool | None]:
    """Each shard's answer (whether a batch would read anything from it), at most ``limit``
    probes at a time. With ``early_stop``: the first ``first_wave`` shards are asked first; if
    one of them has records, the others are not asked (None: plan the shard unasked), else the
    rest are asked as without it. Without records anywhere every shard is asked either way, so
    an empty stream still plans no batch."""
    answers: dict[str, bool | None] = dict.fromkeys(shard_ids)
    gate = asyncio.Semaphore(max(1, limit))

    async def ask(sid: str) -> None:
        async with gate:
            answers[sid] = await probe(sid)

    async def wave(ids: Sequence[str]) -> None:
        await asyncio.gather(*(ask(sid) for sid in ids))

    if not early_stop or len(shard_ids) <= first_wave:
        await wave(shard_ids)
        return answers
    await wave(shard_ids[:first_wave])
    if any(answers[sid] for sid in shard_ids[:first_wave]):
        return answers
    await wave(shard_ids[first_wave:])
    return answers


async def take_iterators(
    shard_ids: Sequence[str],
    take: Callable[[str], Awaitable[str | None]],
    *,
    limit: int = MAX_CONCURRENT,
) -> dict[str, str]:
    """Each shard's iterator that ``take`` gave (None: left out), at most ``limit`` at a time."""
    gate = asyncio.Semaphore(max(1, limit))

    async def one(sid: str) -> str | None:
        async with gate:
            return await take(sid)

    got = await asyncio.gather(*(one(sid) for sid in shard_ids))
    return {sid: it for sid, it in zip(shard_ids, got, strict=True) if it is not None}


class EarlyIterators:
    """The unasked shards' iterators of the last planning, being taken on the driver's loop
    (``take_iterators``) while Spark goes on; by (shard, position)."""

    def __init__(self) -> None:
        self._taking: concurrent.futures.Future[dict[tuple[str, str], str]] | None = None

    def start(self, taking: concurrent.futures.Future[dict[tuple[str, str], str]] | None) -> None:
        """Wait for ``taking`` from now on (None: nothing); an earlier one is cancelled."""
        if self._taking is not None:
            self._taking.cancel()
        self._taking = taking

    def result(self, wait: float = EARLY_WAIT) -> dict[tuple[str, str], str]:
        """The iterators, once taken; none if taking them failed or took over ``wait`` s."""
        taking, self._taking = self._taking, None
        if taking is None:
            return {}
        try:
            return taking.result(timeout=wait)
        except Exception:
            taking.cancel()
            return {}
