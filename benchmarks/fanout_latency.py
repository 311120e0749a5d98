"""Put-to-process latency: enhanced fan-out against polling, on kinesis-local (DynamoDB: moto).

One stream with one shard; a producer writes one record every ``--interval`` seconds (its index
in the data). Five readers run at the same time in this process over the same records: two
``Consumer`` objects with default settings, ``retrieval="fanout"`` and polling (idle time
between reads 1.5 s), whose processors note when each record arrives; and, one layer down, the
fan-out cursor and the polling cursor with 1.5 s and 0.2 s idle time. Fan-out goes through the
test relay that adds kinesis-local's missing initial-response. Prints, per reader, median and p99
from just before the PutRecord call and from its acknowledgement, and the ratio against the
polling Consumer. Then, for the client's own share, the fan-out cursor against the test
event-stream server, which pushes each record as it is written. Bounded by ``--seconds``
(default 40) plus start-up, and 10 s.

kinesis-local pushes fan-out events on its own ~1 s timer, so on this emulator fan-out latency is
bound by that timer; the service pushes records as they arrive (typically ~70 ms).

    uv run python benchmarks/fanout_latency.py [--seconds 40] [--interval 0.25]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import struct
import uuid
from collections.abc import Callable, Sequence

from aiobotocore.session import get_session
from prometheus_client import CollectorRegistry

from kclasync import Consumer, ConsumerConfig
from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync._adapters.protocols import IteratorType, StartingPosition
from kclasync._records import Record
from kclasync._runtime.fanout_cursor import FanOutCursor
from kclasync._runtime.shard_cursor import ShardCursor
from kclasync.testing.emulators import LocalAws, find_kinesis_local, kinesis_local, moto_process
from kclasync.testing.eventstream import FanOutServer
from kclasync.testing.fanout_proxy import KinesisLocalFanOutRelay

START = StartingPosition(IteratorType.TRIM_HORIZON)


def _client(url: str) -> object:
    return get_session().create_client(
        "kinesis",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )


def _observe(
    records: list[Record], loop: asyncio.AbstractEventLoop, sink: dict[int, float]
) -> None:
    now = loop.time()
    for r in records:
        sink[struct.unpack("!I", r.data)[0]] = now


async def _poll(
    client: KinesisStreamClient,
    stream: str,
    shard: str,
    idle: float,
    sink: dict[int, float],
    until: Callable[[], bool],
) -> None:
    loop = asyncio.get_running_loop()
    cursor = ShardCursor(client, stream, shard, START)
    while not until():
        result = await cursor.next(10000)
        _observe(list(result.records), loop, sink)
        caught_up = not result.records and not result.millis_behind_latest
        await asyncio.sleep(idle if caught_up else 0.2)


async def _fan_out(
    fanout: FanOutClient,
    arn: str,
    stream: str,
    shard: str,
    sink: dict[int, float],
    until: Callable[[], bool],
) -> None:
    loop = asyncio.get_running_loop()
    cursor = FanOutCursor(fanout, arn, stream, shard, START)
    async for event in cursor.events():
        _observe(list(event.records), loop, sink)
        if until():
            return


def _stats(values: list[float]) -> tuple[float, float]:
    ms = sorted(x * 1000 for x in values)
    return statistics.median(ms), ms[min(len(ms) - 1, int(len(ms) * 0.99))]


def _consumer(
    aws: LocalAws, endpoint: str, stream: str, sink: dict[int, float], **config: object
) -> Consumer:
    loop = asyncio.get_running_loop()

    async def handle(records: Sequence[Record]) -> None:
        _observe(list(records), loop, sink)

    return Consumer(
        stream_name=stream,
        application_name=f"{stream}-{config.get('retrieval', 'polling')}",
        processor=handle,
        config=ConsumerConfig(initial_position="TRIM_HORIZON", **config),  # type: ignore[arg-type]
        client_options=aws.client_options(kinesis_endpoint_url=endpoint),
        registry=CollectorRegistry(),
    )


async def run(aws: LocalAws, seconds: float, interval: float) -> None:
    upstream = aws.kinesis_endpoint_url
    assert upstream is not None
    stream = f"bench-{uuid.uuid4().hex[:8]}"
    loop = asyncio.get_running_loop()
    async with (
        KinesisLocalFanOutRelay(upstream) as relayed,
        _client(upstream) as raw,  # type: ignore[attr-defined]
        _client(relayed) as via_relay,  # type: ignore[attr-defined]
    ):
        kinesis = KinesisStreamClient(raw)
        await kinesis.create_stream(stream, 1)
        shard = (await kinesis.list_shards(stream))[0].shard_id
        fanout = FanOutClient(via_relay)
        consumer = await fanout.ensure_consumer(stream, "latency", poll_interval=0.1)
        sinks: dict[str, dict[int, float]] = {
            "Consumer, fan-out": {},
            "Consumer, polling": {},
            "cursor, fan-out": {},
            "cursor, polling 1.5 s": {},
            "cursor, polling 0.2 s": {},
        }
        consumers = [
            _consumer(aws, relayed, stream, sinks["Consumer, fan-out"], retrieval="fanout"),
            _consumer(aws, upstream, stream, sinks["Consumer, polling"]),
        ]
        sent: list[tuple[float, float]] = []  # (before the put, when it was acknowledged)
        stop_at = [float("inf")]  # set when the producer starts
        done = lambda: loop.time() > stop_at[0] + 3  # noqa: E731 - drain the last records

        async def produce() -> None:
            await asyncio.sleep(2.0)  # readers subscribed and polling
            stop_at[0] = loop.time() + seconds
            while loop.time() < stop_at[0]:
                before = loop.time()
                data = struct.pack("!I", len(sent))
                await raw.put_record(StreamName=stream, PartitionKey="k", Data=data)
                sent.append((before, loop.time()))
                await asyncio.sleep(interval)

        readers = [
            _fan_out(fanout, consumer.arn, stream, shard, sinks["cursor, fan-out"], done),
            _poll(kinesis, stream, shard, 1.5, sinks["cursor, polling 1.5 s"], done),
            _poll(kinesis, stream, shard, 0.2, sinks["cursor, polling 0.2 s"], done),
        ]
        async with contextlib.AsyncExitStack() as running:
            for c in consumers:
                await running.enter_async_context(c)
            while not all(c.held_leases for c in consumers):
                await asyncio.sleep(0.1)
            await asyncio.gather(produce(), *readers)
    put_median, put_p99 = _stats([ack - before for before, ack in sent])
    print(
        f"kinesis-local, 1 shard, {len(sent)} records, one every {interval * 1000:.0f} ms; "
        f"PutRecord itself: median {put_median:.1f} ms, p99 {put_p99:.1f} ms"
    )
    head = f"{'reader':<22} {'from put call: median':>22} {'p99':>8}"
    print(f"{head}   {'from put ack: median':>21} {'p99':>8}")
    polled = sinks["Consumer, polling"]
    baseline, _ = _stats([polled[i] - before for i, (before, _) in enumerate(sent)])
    for name, sink in sinks.items():
        assert len(sink) == len(sent), f"{name} saw {len(sink)} of {len(sent)} records"
        median, p99 = _stats([sink[i] - before for i, (before, _) in enumerate(sent)])
        ack_median, ack_p99 = _stats([sink[i] - ack for i, (_, ack) in enumerate(sent)])
        print(
            f"{name:<22} {median:19.1f} ms {p99:8.1f}   {ack_median:18.1f} ms {ack_p99:8.1f}"
            f"   ({median / baseline:.2f}x the polling Consumer)"
        )


async def run_framing_server(seconds: float, interval: float) -> None:
    """The client's own share: the fan-out cursor against the test server, which pushes each
    record the moment it is written (as the service does), in real event-stream framing."""
    server = FanOutServer(heartbeat=5.0)
    await server.start()
    loop = asyncio.get_running_loop()
    sink: dict[int, float] = {}
    sent: list[float] = []
    try:
        async with _client(server.url) as client:  # type: ignore[attr-defined]
            fanout = FanOutClient(client)
            arn = (await fanout.ensure_consumer(server.stream, "latency", poll_interval=0.01)).arn
            shard = next(iter(server.shards))
            stop_at = loop.time() + seconds
            finished = lambda: loop.time() > stop_at and len(sink) >= len(sent)  # noqa: E731
            reader = asyncio.create_task(
                _fan_out(fanout, arn, server.stream, shard, sink, finished)
            )
            await asyncio.sleep(0.5)
            while loop.time() < stop_at:
                sent.append(loop.time())
                await server.put(shard, struct.pack("!I", len(sent) - 1))
                await asyncio.sleep(interval)
            await asyncio.wait_for(reader, 10)
    finally:
        await server.stop()
    median, p99 = _stats([sink[i] - t for i, t in enumerate(sent)])
    print(
        f"test event-stream server (pushes on write), {len(sent)} records: fan-out cursor "
        f"median {median:.1f} ms, p99 {p99:.1f} ms (client, framing and loopback only)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--interval", type=float, default=0.25)
    args = parser.parse_args()
    script = find_kinesis_local()
    if script is None:
        raise SystemExit("kinesis-local is not installed: run `npm ci`")
    with moto_process() as moto, kinesis_local(moto, script=script) as aws:
        asyncio.run(run(aws, args.seconds, args.interval))
    asyncio.run(run_framing_server(min(args.seconds, 10.0), 0.05))


if __name__ == "__main__":
    main()
