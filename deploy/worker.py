"""A kclasync worker for the docker-compose stack: prints a line per batch, serves /metrics.

Configured by environment variables (all optional):

    KCLASYNC_STREAM          stream to consume (orders)
    KCLASYNC_APPLICATION     application / lease table name (kclasync-demo)
    KCLASYNC_WORKER_ID       worker id (the host name)
    KCLASYNC_METRICS_HOST    address of the Prometheus endpoint (0.0.0.0)
    KCLASYNC_METRICS_PORT    port of the Prometheus endpoint (9100)
    KCLASYNC_FAILOVER        lease failover time in seconds (10)
    KCLASYNC_STREAM_WAIT     seconds to wait for the stream to be created (120)
    AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION, AWS credentials: as for any AWS client

Runs until SIGTERM or SIGINT, then stops gracefully (batches finish, leases are released).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Sequence

from prometheus_client import start_http_server

from kclasync import Consumer, ConsumerConfig, Record, StreamNotFoundError


def env(name: str, default: str) -> str:
    return os.environ.get(name) or default


async def main() -> int:
    stream = env("KCLASYNC_STREAM", "orders")
    application = env("KCLASYNC_APPLICATION", "kclasync-demo")
    worker_id = env("KCLASYNC_WORKER_ID", socket.gethostname())
    port = int(env("KCLASYNC_METRICS_PORT", "9100"))
    start_http_server(port, addr=env("KCLASYNC_METRICS_HOST", "0.0.0.0"))
    config = ConsumerConfig(
        worker_id=worker_id,
        failover_time=float(env("KCLASYNC_FAILOVER", "10")),
        initial_position="TRIM_HORIZON",
    )

    async def handle(records: Sequence[Record]) -> None:
        last = records[-1]
        print(
            f"{worker_id} {last.shard_id}: {len(records)} records up to {last.sequence_number}",
            flush=True,
        )

    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    deadline = loop.time() + float(env("KCLASYNC_STREAM_WAIT", "120"))
    while not stopping.is_set():
        consumer = Consumer(
            stream_name=stream,
            application_name=application,
            processor=handle,
            config=config,
            endpoint_url=os.environ.get("AWS_ENDPOINT_URL"),
        )
        running = asyncio.create_task(consumer.run())
        stop_wait = asyncio.create_task(stopping.wait())
        await asyncio.wait({running, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        if not running.done():
            await consumer.stop()
            await running
            break
        try:
            running.result()
            break
        except StreamNotFoundError:
            if loop.time() > deadline:
                print(f"{worker_id}: stream {stream!r} does not exist", file=sys.stderr)
                return 1
            await asyncio.sleep(1.0)  # the producer creates it; try again
    print(f"{worker_id} stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
