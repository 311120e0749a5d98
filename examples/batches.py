"""Consume a stream with ``async for batch in consumer.batches()``, on a local emulator.

    uv run python examples/batches.py

Starts moto's server on 127.0.0.1, writes 200 records to a 2-shard stream, reads them batch by
batch (committing each batch after it was handled), and leaves the loop once every record was
seen: the consumer then stops gracefully and releases its leases. Against AWS, drop the
emulator and pass ``region_name=`` instead of ``client_options=``.
"""

from __future__ import annotations

import asyncio
import json

from prometheus_client import CollectorRegistry

from kclasync import ClientOptions, Consumer, ConsumerConfig
from kclasync.testing import LocalAws, moto_process

STREAM = "orders"


async def produce(options: ClientOptions, stream: str, count: int) -> None:
    async with options.create_client("kinesis") as kinesis:
        await kinesis.create_stream(StreamName=stream, ShardCount=2)
        await kinesis.get_waiter("stream_exists").wait(
            StreamName=stream, WaiterConfig={"Delay": 0.2}
        )
        entries = [
            {"Data": json.dumps({"id": i}).encode(), "PartitionKey": f"customer-{i % 17}"}
            for i in range(count)
        ]
        await kinesis.put_records(StreamName=stream, Records=entries)


async def main(aws: LocalAws, stream: str = STREAM, count: int = 200) -> dict[str, int]:
    """Returns the records read per shard."""
    options = aws.client_options()
    await produce(options, stream, count)
    consumer = Consumer(
        stream_name=stream,
        application_name=f"{stream}-billing",  # no processor=: the batches are iterated
        config=ConsumerConfig(initial_position="TRIM_HORIZON", idle_time_between_reads=0.2),
        client_options=options,
        registry=CollectorRegistry(),
    )
    per_shard: dict[str, int] = {}
    seen: set[int] = set()
    async with consumer.batches() as batches:  # on exit: a graceful stop, leases released
        async for batch in batches:
            for record in batch:  # one shard's records, in order
                seen.add(json.loads(record.data)["id"])
            per_shard[batch.shard_id] = per_shard.get(batch.shard_id, 0) + len(batch)
            await batch.commit()  # checkpoint at the batch's last record
            if len(seen) == count:
                break
    return per_shard


if __name__ == "__main__":
    with moto_process() as emulator:
        for shard, n in sorted(asyncio.run(main(emulator)).items()):
            print(f"{shard}: {n} records")
