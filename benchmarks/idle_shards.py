"""What idle shards cost: one worker holding every lease of a stream that carries no traffic.

moto's server runs in its own process, so this process's CPU time is the worker's alone. For each
mode a fresh application (lease table) takes all the stream's leases; once they are all held and
WARMUP seconds have passed, the process CPU and the calls made are counted over WINDOW seconds.
Then a record is put into an idle shard, one shard at a time, and the time from the put's
acknowledgement to the record's processing is the wake-up latency (it must stay within the
configured maximum idle time plus a call). The put's own time is printed apart ("put max"):
moto's server sometimes takes half a second to answer one. The baseline mode is the behaviour
before idle shards were made cheap (a fixed ``idle_time_between_reads``, botocore's request
path), selected through settings, so every mode runs in this one process and the figures are
printed as ratios against it. The modes without the direct request path
(``_adapters/direct_requests.py``) turn it off for their run only; the mode "direct path
through aiohttp" keeps it but sends through the client's aiohttp session instead of kclasync's
own HTTP transport (``_adapters/http_transport.py``), as it did first.

    uv run python benchmarks/idle_shards.py [--shards 100] [--window 60] [--warmup 15] [--wakeups 5]
        [--modes 0,1,2,3,4,5] [--keep-alive]

``--keep-alive`` puts a proxy process between the worker and moto that keeps the worker's
connections open (``benchmarks/keepalive_proxy.py``), to see what a call costs when
connections are reused, as they are on AWS (moto closes each one).

Also ``benchmarks/data_path.py --idle`` (same options).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import time
import uuid
from collections.abc import Iterator, Sequence

import attrs
from aiobotocore.session import get_session

from kclasync import ClientOptions, Consumer, ConsumerConfig, Record
from kclasync._adapters import aws as aws_clients
from kclasync._adapters import direct_requests, http_transport
from kclasync.testing.emulators import LocalAws, free_port, moto_process

REGION = "us-east-1"
CREDS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}
READS = {"scan", "query", "get_item", "ensure_table"}


@attrs.frozen
class Mode:
    name: str
    config: dict[str, object]
    options: dict[str, object]
    direct: bool = True
    #: The direct path sends through kclasync's own HTTP transport (False: through aiohttp).
    transport: bool = True


MODES = (
    Mode(
        "before (fixed 1.5 s, botocore requests)",
        {"max_idle_time_between_reads": 1.5},
        {"fast_requests": False},
    ),
    Mode("fixed 1.5 s, fast requests, no direct path", {}, {}, direct=False),
    Mode("fixed 1.5 s, direct path through aiohttp", {}, {}, transport=False),
    Mode("defaults (fixed 1.5 s, fast + direct)", {}, {}),
    Mode(
        "max idle 6 s, fast requests, no direct path",
        {"max_idle_time_between_reads": 6.0},
        {},
        direct=False,
    ),
    Mode("max idle 6 s, fast + direct", {"max_idle_time_between_reads": 6.0}, {}),
)


@contextlib.contextmanager
def direct_path(on: bool, transport: bool = True) -> Iterator[None]:
    """The direct request path on (as shipped) or off (clients keep botocore's path); with
    ``transport`` False it sends through the client's aiohttp session, as before
    ``_adapters/http_transport.py``."""
    enable = aws_clients.direct_requests.enable
    for_session = http_transport.for_session
    if not on:
        aws_clients.direct_requests.enable = lambda client: None  # type: ignore[assignment]
    if not transport:
        http_transport.for_session = lambda session: None  # type: ignore[assignment]
    try:
        yield
    finally:
        aws_clients.direct_requests.enable = enable  # type: ignore[method-assign]
        http_transport.for_session = for_session


@attrs.frozen
class Figures:
    cpu_share: float  # of one core
    cpu_per_shard_hour: float  # CPU seconds
    get_records_per_shard_hour: float
    cpu_ms_per_call: float  # every AWS call of the worker in the window
    lease_writes_per_shard_hour: float
    wakeups: tuple[float, ...]  # seconds, from the put's acknowledgement to the processing
    puts: tuple[float, ...]  # seconds each put took (moto's server sometimes takes 0.5 s)
    lost: float  # leases lost in the window (renewals late on a loaded machine)
    bound: float  # the configured maximum idle time
    direct: int  # calls made on the direct path (the whole run)
    fallbacks: int  # direct attempts made again through botocore


async def make_stream(aws: LocalAws, stream: str, shards: int) -> dict[str, str]:
    """The stream, and one explicit hash key inside each shard, by shard id."""
    async with get_session().create_client(
        "kinesis", region_name=REGION, endpoint_url=aws.endpoint_url, **CREDS
    ) as client:
        await client.create_stream(StreamName=stream, ShardCount=shards)
        while True:
            desc = await client.describe_stream_summary(StreamName=stream)
            if desc["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                break
            await asyncio.sleep(0.1)
        keys: dict[str, str] = {}
        kwargs: dict[str, object] = {"StreamName": stream}
        while True:
            resp = await client.list_shards(**kwargs)
            for shard in resp["Shards"]:
                keys[shard["ShardId"]] = shard["HashKeyRange"]["StartingHashKey"]
            if not resp.get("NextToken"):
                return keys
            kwargs = {"NextToken": resp["NextToken"]}


def lost_leases(consumer: Consumer) -> float:
    total = 0.0
    for sample in consumer.metrics.leases_lost.collect()[0].samples:
        if sample.name.endswith("_total"):
            total += sample.value
    return total


async def measure(
    aws: LocalAws,
    stream: str,
    hash_keys: dict[str, str],
    mode: Mode,
    args: argparse.Namespace,
    worker_url: str,
) -> Figures:
    processed: dict[str, float] = {}
    arrived = asyncio.Event()

    async def handle(batch: Sequence[Record]) -> None:
        now = time.perf_counter()
        for record in batch:
            processed.setdefault(record.partition_key, now)
        arrived.set()

    # TRIM_HORIZON: a lease lost to a late renewal on a loaded machine and taken again reads
    # from the start of its (empty) shard, so a wake-up record is late, never skipped.
    config = ConsumerConfig(initial_position="TRIM_HORIZON", **mode.config)  # type: ignore[arg-type]
    app = f"idle-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(
        stream_name=stream,
        application_name=app,
        processor=handle,
        config=config,
        client_options=ClientOptions(
            region_name=REGION,
            endpoint_url=worker_url,
            **CREDS,
            **mode.options,  # type: ignore[arg-type]
        ),
    )
    task = asyncio.create_task(consumer.run())
    try:
        deadline = time.perf_counter() + 120
        while len(consumer.held_leases) < len(hash_keys):
            if task.done() or time.perf_counter() > deadline:
                raise RuntimeError(f"only {len(consumer.held_leases)} leases held")
            await asyncio.sleep(0.2)
        await asyncio.sleep(args.warmup)
        lost0 = lost_leases(consumer)
        store, kinesis = consumer._store, consumer._stream_client
        assert store is not None and kinesis is not None
        calls0 = dict(kinesis.calls)  # type: ignore[attr-defined]
        writes0 = dict(store.calls)  # type: ignore[attr-defined]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(args.window)
        cpu1, wall1 = time.process_time(), time.perf_counter()
        calls1 = dict(kinesis.calls)  # type: ignore[attr-defined]
        writes1 = dict(store.calls)  # type: ignore[attr-defined]
        shard_hours = len(hash_keys) * (wall1 - wall0) / 3600
        get_records = calls1.get("get_records", 0) - calls0.get("get_records", 0)
        writes = sum(n - writes0.get(op, 0) for op, n in writes1.items() if op not in READS)
        calls = sum(calls1.values()) + sum(writes1.values())
        calls -= sum(calls0.values()) + sum(writes0.values())
        lost = lost_leases(consumer) - lost0
        callers = [direct_requests.caller_for(c._client) for c in (store, kinesis)]  # type: ignore[attr-defined]
        direct = sum(c.direct for c in callers if c is not None)
        fallbacks = sum(c.fallbacks for c in callers if c is not None)
        wakeups: list[float] = []
        puts: list[float] = []
        rng = random.Random(args.seed)
        async with get_session().create_client(
            "kinesis", region_name=REGION, endpoint_url=aws.endpoint_url, **CREDS
        ) as producer:
            for i in range(args.wakeups):
                # A random moment within the shards' idle cycle, into a shard held right now (on
                # a loaded machine a lease may be lost to a late renewal and taken again later).
                await asyncio.sleep(rng.uniform(0, config.effective_max_idle_time))
                shard = rng.choice(sorted(consumer.held_leases))
                pk = f"{app}-wake-{i}"
                t0 = time.perf_counter()
                await producer.put_record(
                    StreamName=stream,
                    PartitionKey=pk,
                    ExplicitHashKey=hash_keys[shard],
                    Data=b"x" * 100,
                )
                acked = time.perf_counter()
                puts.append(acked - t0)
                while pk not in processed:
                    if time.perf_counter() - t0 > 60:
                        raise RuntimeError(f"record {pk} not processed within 60 s")
                    arrived.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(arrived.wait(), 1.0)
                wakeups.append(processed[pk] - acked)
    finally:
        await consumer.stop()
        await task
    return Figures(
        cpu_share=(cpu1 - cpu0) / (wall1 - wall0),
        cpu_per_shard_hour=(cpu1 - cpu0) / shard_hours,
        get_records_per_shard_hour=get_records / shard_hours,
        cpu_ms_per_call=(cpu1 - cpu0) / max(calls, 1) * 1000,
        lease_writes_per_shard_hour=writes / shard_hours,
        wakeups=tuple(wakeups),
        puts=tuple(puts),
        lost=lost,
        bound=config.effective_max_idle_time,
        direct=direct,
        fallbacks=fallbacks,
    )


async def main(args: argparse.Namespace) -> None:
    with contextlib.ExitStack() as stack:
        aws = stack.enter_context(moto_process())
        worker_url = aws.endpoint_url
        if args.keep_alive:
            from keepalive_proxy import keepalive_proxy

            worker_url = stack.enter_context(keepalive_proxy(aws.endpoint_url, free_port()))
        stream = f"idle-{uuid.uuid4().hex[:6]}"
        hash_keys = await make_stream(aws, stream, args.shards)
        async with get_session().create_client(
            "dynamodb", region_name=REGION, endpoint_url=aws.endpoint_url, **CREDS
        ) as ddb:
            await ddb.list_tables()  # moto loads its DynamoDB code on the first call
        results: list[tuple[Mode, Figures]] = []
        for mode in [MODES[int(i)] for i in args.modes.split(",")]:
            with direct_path(mode.direct, mode.transport):
                figures = await measure(aws, stream, hash_keys, mode, args, worker_url)
            results.append((mode, figures))
            print(f"  {mode.name}: {figures}", flush=True)
    base = results[0][1]
    print()
    print(
        f"{args.shards} idle shards, one worker, {args.window:g} s window "
        f"(after all leases were held + {args.warmup:g} s); moto in its own process"
        + (", the worker's connections kept open by a proxy process" if args.keep_alive else "")
    )
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    header = (
        f"{'mode':<46}{'% core':>8}{'ratio':>7}{'CPU s/shard-h':>15}{'ms/call':>9}"
        f"{'GetRecords/shard-h':>20}{'lease writes/shard-h':>22}"
        f"{'wake-up med/max s':>19}{'bound s':>9}{'put max s':>11}{'lost':>6}"
        f"{'direct/fallback':>17}"
    )
    print(header)
    for mode, f in results:
        print(
            f"{mode.name:<46}{f.cpu_share * 100:>8.1f}{f.cpu_share / base.cpu_share:>7.2f}"
            f"{f.cpu_per_shard_hour:>15.2f}{f.cpu_ms_per_call:>9.2f}"
            f"{f.get_records_per_shard_hour:>20.0f}"
            f"{f.lease_writes_per_shard_hour:>22.0f}"
            f"{statistics.median(f.wakeups):>10.2f}/{max(f.wakeups):<8.2f}{f.bound:>9.2f}"
            f"{max(f.puts):>11.2f}{f.lost:>6.0f}"
            f"{f.direct:>10}/{f.fallbacks:<6}"
        )


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--window", type=float, default=60.0, help="seconds of CPU counted")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds after all are held")
    parser.add_argument("--wakeups", type=int, default=5, help="records put into idle shards")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--keep-alive",
        action="store_true",
        help="the worker reaches moto through a proxy process that keeps its connections open"
        " (as AWS does; moto closes every one)",
    )
    parser.add_argument(
        "--modes", default=",".join(str(i) for i in range(len(MODES))), help="indexes of MODES"
    )


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments(cli)
    asyncio.run(main(cli.parse_args()))
