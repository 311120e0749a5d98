"""Which shards of a planning the Spark source's driver asks before planning a batch.

Owns: running the probes of one planning (``kclasync.spark.fetch.has_new_records``, passed in)
with bounded concurrency, and the first planning's early stop: once one probe of a query's
first planning found records, the batch runs anyway, so the shards not yet asked are planned
unasked (their reads find out for themselves, on the executors, alongside the other reads).
Must not: talk to AWS itself, import pyspark, or decide quotas (``kclasync.spark.offsets``).

Calls: at most one probe (a GetShardIterator and a 2-record GetRecords) per shard and planning,
as before; with the early stop a query's first planning over a stream with records asks
``FIRST_WAVE`` shards instead of all of them. What the early stop costs: a shard planned
unasked that holds nothing is read empty by its task and gets a progress record (one
conditional PutItem), once per query, not per batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

__all__ = ["FIRST_WAVE", "MAX_CONCURRENT", "probe_shards"]

#: Probes in flight at once: the driver's Kinesis client's connection pool
#: (``ClientOptions.max_pool_connections``); more would only queue in the client.
MAX_CONCURRENT = 64

#: Shards a query's first planning asks before it may stop asking (``probe_shards``).
FIRST_WAVE = 8


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
