"""Put-to-process latency: enhanced fan-out against polling, on kinesis-local.

One stream with one shard; a producer writes one record every ``--interval`` seconds carrying the
event-loop time just before its PutRecord call. Three readers run at the same time in this
process over the same records: the fan-out cursor (SubscribeToShard, through the test relay that
adds kinesis-local's missing initial-response), the polling cursor with the default idle time
between reads (1.5 s), and the polling cursor with 0.2 s. Each records, per record, the time
from just before the put to the moment the record reached it. Prints median and p99 per reader
and the ratios against the default polling reader. Bounded by ``--seconds`` (default 40).

kinesis-local pushes fan-out events on its own ~1 s timer, so on this emulator fan-out latency is
bound by that timer; the service pushes records as they arrive (typically ~70 ms).

    uv run python benchmarks/fanout_latency.py [--seconds 40] [--interval 0.25]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import uuid
from collections.abc import Callable

from aiobotocore.session import get_session

from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync._adapters.protocols import IteratorType, StartingPosition
from kclasync._records import Record
from kclasync._runtime.fanout_cursor import FanOutCursor
from kclasync._runtime.shard_cursor import ShardCursor
from kclasync.testing.emulators import LocalAws, find_kinesis_local, kinesis_local
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


async def run(upstream: str, seconds: float, interval: float) -> None:
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
            "fan-out": {},
            "polling idle 1.5 s": {},
            "polling idle 0.2 s": {},
        }
        sent: list[tuple[float, float]] = []  # (before the put, when it was acknowledged)
        stop_at = loop.time() + seconds
        done = lambda: loop.time() > stop_at + 3  # noqa: E731 - drain the last records

        async def produce() -> None:
            await asyncio.sleep(2.0)  # readers subscribed and polling
            while loop.time() < stop_at:
                before = loop.time()
                data = struct.pack("!I", len(sent))
                await raw.put_record(StreamName=stream, PartitionKey="k", Data=data)
                sent.append((before, loop.time()))
                await asyncio.sleep(interval)

        readers = [
            _fan_out(fanout, consumer.arn, stream, shard, sinks["fan-out"], done),
            _poll(kinesis, stream, shard, 1.5, sinks["polling idle 1.5 s"], done),
            _poll(kinesis, stream, shard, 0.2, sinks["polling idle 0.2 s"], done),
        ]
        await asyncio.gather(produce(), *readers)
    put_median, put_p99 = _stats([ack - before for before, ack in sent])
    print(
        f"kinesis-local, 1 shard, {len(sent)} records, one every {interval * 1000:.0f} ms; "
        f"PutRecord itself: median {put_median:.1f} ms, p99 {put_p99:.1f} ms"
    )
    head = f"{'reader':<20} {'from put call: median':>22} {'p99':>8}"
    print(f"{head}   {'from put ack: median':>21} {'p99':>8}")
    polled = sinks["polling idle 1.5 s"]
    baseline, _ = _stats([polled[i] - before for i, (before, _) in enumerate(sent)])
    for name, sink in sinks.items():
        assert len(sink) == len(sent), f"{name} saw {len(sink)} of {len(sent)} records"
        median, p99 = _stats([sink[i] - before for i, (before, _) in enumerate(sent)])
        ack_median, ack_p99 = _stats([sink[i] - ack for i, (_, ack) in enumerate(sent)])
        print(
            f"{name:<20} {median:19.1f} ms {p99:8.1f}   {ack_median:18.1f} ms {ack_p99:8.1f}"
            f"   ({median / baseline:.2f}x polling idle 1.5 s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--interval", type=float, default=0.25)
    args = parser.parse_args()
    script = find_kinesis_local()
    if script is None:
        raise SystemExit("kinesis-local is not installed: run `npm ci`")
    with kinesis_local(LocalAws("http://127.0.0.1:1"), script=script) as aws:
        assert aws.kinesis_endpoint_url is not None
        asyncio.run(run(aws.kinesis_endpoint_url, args.seconds, args.interval))


if __name__ == "__main__":
    main()
