"""``async for batch in consumer.batches()`` on moto: per-shard order, commits in the lease
table, resuming, lease loss, leaving the loop, errors and buffered commits (backpressure and
resharding: tests/runtime/test_batches.py, in virtual time)."""

from __future__ import annotations

import importlib.util
import pathlib

import orjson
import pytest

from kclasync import LeaseLostError, ShardBatch, StreamNotFoundError
from kclasync._core.leases.position import TRIM_HORIZON
from kclasync.testing.emulators import LocalAws
from tests.support import Aws, aws_for, wait_until

pytestmark = pytest.mark.asyncio
EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "batches.py"


def ids_of(batch: ShardBatch) -> list[int]:
    return [int(orjson.loads(r.data)["id"]) for r in batch]


async def checkpoints(aws: Aws) -> dict[str, str]:
    return {lease.key: lease.checkpoint.value for lease in (await aws.store.list_leases()).leases}


async def owners(aws: Aws) -> list[str | None]:
    return [lease.owner for lease in (await aws.store.list_leases()).leases]


async def test_batches_keep_shard_order_and_break_releases_the_leases(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        ids = set(await aws.produce(120))
        consumer = aws.consumer(None, max_records=15)
        seen: dict[str, list[tuple[int, int]]] = {}
        got: set[int] = set()
        async for batch in consumer.batches():
            assert not batch.stale
            positions = [r.position for r in batch]
            assert positions == sorted(positions)
            seen.setdefault(batch.shard_id, []).extend(positions)
            got.update(ids_of(batch))
            await batch.commit()
            if got >= ids:
                break

        # Leaving the loop stops the consumer gracefully: the leases are released, not left
        # to expire (stop() is only the clean-up here).
        async def released() -> bool:
            return await owners(aws) == [None, None]

        await wait_until(released, 15, "the leases to be released after the break")
        await consumer.stop()
        assert got == ids
        # Each shard's batches came in shard order (interleaving: tests/runtime/test_batches.py).
        for positions in seen.values():
            assert positions == sorted(positions) and len(set(positions)) == len(positions)
        assert len(seen) == 2
        # The commits are in the table, and the leases were released, not left to expire.
        assert await checkpoints(aws) == {
            shard: str(positions[-1][0]) for shard, positions in seen.items()
        }


async def test_commits_buffered_and_at_a_record_and_a_second_consumer_resumes(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(1)
        ids = await aws.produce(100)
        first = aws.consumer(None, max_records=10, worker_id="first", checkpoint_interval=3600.0)
        got: list[int] = []
        async with first.batches() as batches:
            async for batch in batches:
                got.extend(ids_of(batch))
                if len(got) < 30:
                    await batch.commit(persist=False)
                else:
                    middle = batch.records[len(batch) // 2]
                    done = len(got) - len(batch) + len(batch) // 2 + 1  # records up to it
                    await batch.commit(middle, persist=False)
                # Buffered: nothing is written while the loop runs (interval: an hour).
                assert set((await checkpoints(aws)).values()) == {TRIM_HORIZON.value}
                if len(got) >= 30:
                    break
        # Leaving the loop wrote the newest buffered position: the record committed last.
        (key,) = await checkpoints(aws)
        assert (await checkpoints(aws))[key] == middle.sequence_number
        assert await owners(aws) == [None]
        second = aws.consumer(None, max_records=10, worker_id="second")
        rest: list[int] = []
        async with second.batches() as batches:
            async for batch in batches:
                rest.extend(ids_of(batch))
                if len(rest) >= len(ids) - done:
                    await batch.commit()
                    break
        assert got[:done] + rest == ids


async def test_a_commit_on_a_lost_lease_raises_and_writes_nothing(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(1)
        await aws.produce(50)
        consumer = aws.consumer(None, max_records=10, failover_time=2.0)
        async with consumer.batches() as batches:
            stream = aiter(batches)
            first = await anext(stream)
            await first.commit()
            held = await anext(stream)
            (key,) = consumer.held_leases

            async def steal() -> bool:  # conditional on the counter read: a renewal may win
                lease = await aws.store.get_lease(key)
                assert lease is not None
                return await aws.store.take_lease(lease, "intruder") is not None

            await wait_until(steal, 10, "the intruder's take")
            # The renewer finds out; the batch in hand says it is stale, and its commit is
            # fenced like a processor's checkpoint.
            await wait_until(lambda: held.stale, 10, "the held batch to turn stale")
            with pytest.raises(LeaseLostError):
                await held.commit()
            after = await aws.store.get_lease(key)
            assert after is not None and after.owner == "intruder"
            assert after.checkpoint.value == first.records[-1].sequence_number


async def test_an_error_in_the_loop_stops_gracefully_without_checkpointing_its_batch(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        await aws.produce(200)
        consumer = aws.consumer(None, max_records=20, worker_id="failing")
        committed: dict[str, str] = {}
        with pytest.raises(ValueError, match="bad record"):
            async with consumer.batches() as batches:
                async for batch in batches:
                    if len(committed) == 2:
                        failed = batch
                        raise ValueError("bad record")
                    await batch.commit()
                    committed[batch.shard_id] = batch.records[-1].sequence_number
        # As for a processor that fails: the batch is not checkpointed (the next owner reads it
        # again, from the checkpoint), and the leases are released, not left to expire.
        assert await checkpoints(aws) == committed
        assert int(failed.records[0].sequence_number) > int(committed[failed.shard_id])
        assert await owners(aws) == [None, None]


async def test_run_errors_surface_from_the_iteration(moto: LocalAws, unique_name: str) -> None:
    async with aws_for(moto, unique_name) as aws:
        consumer = aws.consumer(None)  # no such stream
        with pytest.raises(StreamNotFoundError):
            async for _batch in consumer.batches():
                raise AssertionError("no batch can come from a missing stream")


async def test_the_example_reads_every_record(moto: LocalAws, unique_name: str) -> None:
    spec = importlib.util.spec_from_file_location("batches_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    per_shard = await example.main(moto, stream=unique_name, count=100)
    assert sum(per_shard.values()) == 100 and len(per_shard) == 2
