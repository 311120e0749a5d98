"""When one shard's read for a batch stops at the tip: a page shorter than asked for that is
0 ms behind ends it without an empty GetRecords after it (moto's server, and the in-memory
stream for what moto cannot show); a full page that reports 0 ms behind does not."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs

from kclasync._adapters.memory.stream_client import MemoryStreamClient
from kclasync._adapters.protocols import GetRecordsResult
from kclasync.spark.fetch import MAX_PAGE, read_shard
from kclasync.spark.offsets import TRIM_HORIZON, format_position
from kclasync.testing.emulators import LocalAws
from tests.support import aws_for


class Counting:
    """A stream client that counts GetRecords calls; ``behind``: the MillisBehindLatest every
    page reports instead of the server's (None: the server's)."""

    def __init__(self, client: Any, behind: int | None = None) -> None:
        self.client = client
        self.behind = behind
        self.pages: list[tuple[int, int | None]] = []

    async def get_records(self, *args: Any, **kwargs: Any) -> GetRecordsResult:
        result: GetRecordsResult = await self.client.get_records(*args, **kwargs)
        if self.behind is not None:
            result = attrs.evolve(result, millis_behind_latest=self.behind)
        self.pages.append((len(result.records), result.millis_behind_latest))
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_a_short_page_at_the_tip_ends_the_read_in_one_call(
    moto: LocalAws, unique_name: str
) -> None:
    async def go() -> None:
        async with aws_for(moto, unique_name) as aws:
            await aws.create_stream(1)
            await aws.produce(30)
            [shard] = await aws.stream.list_shards(unique_name)
            client = Counting(aws.stream)
            read = await read_shard(client, unique_name, shard.shard_id, TRIM_HORIZON, quota=100)
            assert len(read.records) == 30
            assert client.pages == [(30, 0)]
            assert not read.progress.more and not read.progress.ended
            assert read.progress.end == format_position(read.records[-1])

            # From there: nothing new is one empty page; a new record is one short page.
            end = read.progress.end
            again = await read_shard(client, unique_name, shard.shard_id, end, quota=100)
            assert again.records == [] and again.progress.end == end
            await aws.produce(1)
            later = await read_shard(client, unique_name, shard.shard_id, end, quota=100)
            assert len(later.records) == 1
            assert client.pages[1:] == [(1, 0), (2, 0)]  # AT_SEQUENCE_NUMBER repeats the start

    asyncio.run(go())


def test_a_full_page_reported_0_ms_behind_is_not_the_tip() -> None:
    async def go() -> None:
        memory = MemoryStreamClient()
        stream = memory.create_stream("s", 1)
        [shard] = stream.shards
        total = MAX_PAGE + 50
        for i in range(total):
            memory.put_record("s", f"k{i}", b"x")
        client = Counting(memory, behind=0)  # an emulator that always says 0 (kinesalite)
        read = await read_shard(client, "s", shard.shard_id, TRIM_HORIZON, quota=2 * MAX_PAGE)
        assert len(read.records) == total
        assert client.pages == [(MAX_PAGE, 0), (50, 0)]

        # Reading up to a quota asks for one record more than it needs, so a page that ends
        # at the quota is not mistaken for the tip either.
        client.pages.clear()
        capped = await read_shard(client, "s", shard.shard_id, TRIM_HORIZON, quota=40)
        assert len(capped.records) == 40 and capped.progress.more
        assert client.pages == [(41, 0)]

    asyncio.run(go())
