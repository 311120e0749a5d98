"""The same processor in-process with kclasync: no child processes, no properties file."""

import asyncio
import json

from kclasync import Consumer, ConsumerConfig


async def save(order: dict) -> None:
    print(order["id"], order["total"], flush=True)  # your work here


class OrdersProcessor:
    async def initialize(self, shard):
        self.shard_id = shard.shard_id

    async def process_records(self, records, checkpointer, millis_behind_latest):
        for record in records:
            await save(json.loads(record.data))
        await checkpointer.checkpoint()

    async def lease_lost(self):
        pass

    async def shard_ended(self, checkpointer):
        await checkpointer.checkpoint_shard_end()

    async def shutdown_requested(self, checkpointer):
        if checkpointer.last_delivered is not None:  # something was delivered
            await checkpointer.checkpoint()


async def main() -> None:
    consumer = Consumer(
        stream_name="orders",
        application_name="billing",
        processor=OrdersProcessor,
        region_name="us-east-1",
        config=ConsumerConfig(
            initial_position="TRIM_HORIZON",
            failover_time=10.0,
            max_records=1000,
            idle_time_between_reads=1.0,
        ),
    )
    await consumer.run()


if __name__ == "__main__":
    asyncio.run(main())
