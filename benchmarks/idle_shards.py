"""What idle shards cost: one worker holding every lease of a stream that carries no traffic.

The emulators run in their own processes, so this process's CPU time is the worker's alone. For
each mode a fresh application (lease table) takes all the stream's leases; once they are all held
and WARMUP seconds have passed, the process CPU and the calls made are counted over WINDOW
seconds. Then a record is put into an idle shard, one shard at a time, and the time from the
put's acknowledgement to the record's processing is the wake-up latency (it must stay within the
configured maximum idle time plus a call). The put's own time is printed apart ("put max"):
moto's server sometimes takes half a second to answer one. The first mode is botocore's request
path as it is (``fast_requests=False``), selected through settings, so every mode runs in this
one process and the figures are printed as ratios against it.

The modes use only public settings, so the same script measures an earlier checkout of kclasync
too: run it with that checkout's environment (its own ``uv run``) and the figures of both can be
set side by side (``--label`` names the run).

    uv run python benchmarks/idle_shards.py [--shards 100] [--window 60] [--warmup 15]
        [--wakeups 5] [--modes 0,1,2] [--keep-alive | --kinesis-local] [--label NAME]

``--keep-alive`` puts a proxy process between the worker and moto that keeps the worker's
connections open (``benchmarks/keepalive_proxy.py``), to see what a call costs when
connections are reused, as they are on AWS (moto closes each one). ``--kinesis-local`` reads the
stream from kinesis-local (which keeps connections open, as AWS does) and keeps the lease table
on moto; its mode 3 is enhanced fan-out (through kinesis-local's relay, in its own process:
``benchmarks/fanout_relay.py``).

Also ``benchmarks/data_path.py --idle`` (same options).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import math
import os
import random
import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any

import attrs
from aiobotocore.session import get_session

import kclasync
from kclasync import ClientOptions, Consumer, ConsumerConfig, Record
from kclasync.testing.emulators import LocalAws, free_port, kinesis_local, moto_process

REGION = "us-east-1"
CREDS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}
READS = {"scan", "query", "get_item", "ensure_table"}


@attrs.frozen
class Mode:
    name: str
    config: dict[str, object]
    options: dict[str, object]
    #: Only on kinesis-local (fan-out: moto has no SubscribeToShard).
    fanout: bool = False


MODES = (
    Mode("botocore requests (fast_requests=False)", {}, {"fast_requests": False}),
    Mode("defaults (fixed 1.5 s)", {}, {}),
    Mode("max idle 6 s", {"max_idle_time_between_reads": 6.0}, {}),
    Mode("enhanced fan-out", {"retrieval": "fanout"}, {}, fanout=True),
)


def direct_counts(clients: Sequence[Any]) -> tuple[int, int] | None:
    """(direct calls, fallbacks) where the kclasync measured has a direct request path."""
    try:
        direct = importlib.import_module("kclasync._adapters.direct_requests")
    except ImportError:
        return None
    callers = [direct.caller_for(c) for c in clients]
    return (
        sum(c.direct for c in callers if c is not None),
        sum(c.fallbacks for c in callers if c is not None),
    )


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
    direct: tuple[int, int] | None  # direct calls and fallbacks (a direct path only)


def stream_url(aws: LocalAws) -> str:
    return aws.kinesis_endpoint_url or aws.endpoint_url


async def make_stream(aws: LocalAws, stream: str, shards: int) -> dict[str, str]:
    """The stream, and one explicit hash key inside each shard, by shard id."""
    async with get_session().create_client(
        "kinesis", region_name=REGION, endpoint_url=stream_url(aws), **CREDS
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
    kinesis_url: str | None,
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
            kinesis_endpoint_url=kinesis_url,
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
        direct = direct_counts([c._client for c in (store, kinesis)])  # type: ignore[attr-defined]
        wakeups: list[float] = []
        puts: list[float] = []
        rng = random.Random(args.seed)
        async with get_session().create_client(
            "kinesis", region_name=REGION, endpoint_url=stream_url(aws), **CREDS
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
                        # Printed as inf: kinesis-local's fan-out has left a record that long.
                        print(f"  record {pk} not processed within 60 s", flush=True)
                        break
                    arrived.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(arrived.wait(), 1.0)
                wakeups.append(processed[pk] - acked if pk in processed else math.inf)
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
    )


async def main(args: argparse.Namespace) -> None:
    modes = [MODES[int(i)] for i in args.modes.split(",")]
    if not args.kinesis_local:
        modes = [m for m in modes if not m.fanout]  # moto has no SubscribeToShard
    with contextlib.ExitStack() as stack:
        aws = stack.enter_context(moto_process())
        worker_url = aws.endpoint_url
        if args.keep_alive:
            from keepalive_proxy import keepalive_proxy

            worker_url = stack.enter_context(keepalive_proxy(aws.endpoint_url, free_port()))
        relay: str | None = None
        if args.kinesis_local:
            aws = stack.enter_context(kinesis_local(aws))
            if any(m.fanout for m in modes):
                from fanout_relay import relay_process

                relay = stack.enter_context(relay_process(stream_url(aws)))
        stream = f"idle-{uuid.uuid4().hex[:6]}"
        hash_keys = await make_stream(aws, stream, args.shards)
        async with get_session().create_client(
            "dynamodb", region_name=REGION, endpoint_url=aws.endpoint_url, **CREDS
        ) as ddb:
            await ddb.list_tables()  # moto loads its DynamoDB code on the first call
        results: list[tuple[Mode, Figures]] = []
        for mode in modes:
            kinesis_url = relay if mode.fanout else aws.kinesis_endpoint_url
            figures = await measure(aws, stream, hash_keys, mode, args, worker_url, kinesis_url)
            results.append((mode, figures))
            print(f"  {mode.name}: {figures}", flush=True)
    base = results[0][1]
    print()
    where = (
        "the stream on kinesis-local (connections kept open), the lease table on moto"
        if args.kinesis_local
        else "moto"
    )
    print(
        f"[{args.label}] kclasync from {os.path.dirname(kclasync.__file__)}: {args.shards} idle "
        f"shards, one worker, {args.window:g} s window (after all leases were held + "
        f"{args.warmup:g} s); {where}, in their own processes"
        + (", the worker's connections kept open by a proxy process" if args.keep_alive else "")
    )
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    header = (
        f"{'mode':<42}{'% core':>8}{'ratio':>7}{'CPU s/shard-h':>15}{'ms/call':>9}"
        f"{'GetRecords/shard-h':>20}{'lease writes/shard-h':>22}"
        f"{'wake-up med/max s':>19}{'bound s':>9}{'put max s':>11}{'lost':>6}"
        f"{'direct/fallback':>17}"
    )
    print(header)
    for mode, f in results:
        direct = "-" if f.direct is None else f"{f.direct[0]}/{f.direct[1]}"
        print(
            f"{mode.name:<42}{f.cpu_share * 100:>8.1f}{f.cpu_share / base.cpu_share:>7.2f}"
            f"{f.cpu_per_shard_hour:>15.2f}{f.cpu_ms_per_call:>9.2f}"
            f"{f.get_records_per_shard_hour:>20.0f}"
            f"{f.lease_writes_per_shard_hour:>22.0f}"
            f"{statistics.median(f.wakeups):>10.2f}/{max(f.wakeups):<8.2f}{f.bound:>9.2f}"
            f"{max(f.puts):>11.2f}{f.lost:>6.0f}{direct:>17}"
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
        "--kinesis-local",
        action="store_true",
        help="the stream on kinesis-local (keeps connections open), the lease table on moto",
    )
    parser.add_argument("--label", default="run", help="a name for this run in the output")
    parser.add_argument(
        "--modes", default=",".join(str(i) for i in range(len(MODES))), help="indexes of MODES"
    )


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments(cli)
    asyncio.run(main(cli.parse_args()))
