"""The docker-compose stack's producer: creates the stream if needed, then writes JSON records.

Environment (all optional):

    KCLASYNC_STREAM            stream (orders)
    KCLASYNC_SHARDS            shards when it creates the stream (4)
    KCLASYNC_RATE              records per second (50)
    KCLASYNC_PRODUCE_SECONDS   stop after this long (0: until SIGTERM)
    AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION, AWS credentials: as for any AWS client

Prints the number of records written when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from typing import Any

from aiobotocore.session import get_session


def env(name: str, default: str) -> str:
    return os.environ.get(name) or default


async def ensure_stream(kinesis: Any, stream: str, shards: int) -> None:
    with contextlib.suppress(kinesis.exceptions.ResourceInUseException):  # it exists already
        await kinesis.create_stream(StreamName=stream, ShardCount=shards)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        desc = await kinesis.describe_stream_summary(StreamName=stream)
        if desc["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
            return
        if loop.time() > deadline:
            raise TimeoutError(f"stream {stream} not ACTIVE after 60 s")
        await asyncio.sleep(0.5)


async def main() -> int:
    stream = env("KCLASYNC_STREAM", "orders")
    rate = max(1, int(env("KCLASYNC_RATE", "50")))
    seconds = float(env("KCLASYNC_PRODUCE_SECONDS", "0"))
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    written = 0
    session = get_session()
    async with session.create_client(
        "kinesis", endpoint_url=os.environ.get("AWS_ENDPOINT_URL")
    ) as kinesis:
        await ensure_stream(kinesis, stream, int(env("KCLASYNC_SHARDS", "4")))
        end = loop.time() + seconds if seconds > 0 else None
        tick = 0.2
        per_tick = max(1, round(rate * tick))
        while not stopping.is_set() and (end is None or loop.time() < end):
            entries = [
                {
                    "PartitionKey": f"customer-{(written + i) % 97}",
                    "Data": json.dumps({"order": written + i}).encode(),
                }
                for i in range(per_tick)
            ]
            while entries:  # re-send what was throttled
                resp = await kinesis.put_records(StreamName=stream, Records=entries)
                results = resp["Records"]
                failed = [e for e, r in zip(entries, results, strict=True) if "ErrorCode" in r]
                written += len(entries) - len(failed)
                entries = failed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), tick)
    print(f"produced {written} records", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
