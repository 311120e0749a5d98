"""Client CPU per record: a bare aiobotocore GetRecords loop against kclasync, on one stream.

Both read the same backlog (RECORDS records of about 100 bytes over SHARDS shards, written once)
from moto's server running in its own process, so this process's CPU time is the client's alone.
CPU is counted from the first record received to the last, so start-up (table creation, the
first taking round) is left out of both. Each figure is the median of ROUNDS runs, alternating
the two readers. Then one more kclasync run under cProfile gives kclasync's own share: the time
spent in kclasync's modules (everything outside botocore, aiohttp and the standard library),
per record.

    uv run python benchmarks/data_path.py [--records 100000] [--shards 4] [--rounds 3]
        [--kinesis-local] [--label NAME]

``--kinesis-local`` reads the stream from kinesis-local (which keeps connections open, as AWS
does) and keeps the lease table on moto. The script uses only public settings, so an earlier
checkout of kclasync can be measured with it too (run with that checkout's environment), and the
two ratios against the bare loop set side by side.

``--startup`` instead measures the wall time from ``run()`` to the first record of a lone
worker: on an empty lease table, on one whose leases were released by a graceful stop, and on
one whose leases are still held by the same worker id after a crash (the task is cancelled, so
nothing is released).

    uv run python benchmarks/data_path.py --startup [--rounds 3]

``--idle`` instead runs ``benchmarks/idle_shards.py`` (what 100 idle shards cost one worker:
CPU per idle shard-hour, calls per shard-hour, wake-up latency; before and after in one run).

    uv run python benchmarks/data_path.py --idle [--shards 100] [--window 60]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import Sequence

from aiobotocore.session import get_session

import kclasync
from kclasync import Consumer, ConsumerConfig, Record
from kclasync.testing.emulators import LocalAws, kinesis_local, moto_process

REGION = "us-east-1"
CREDS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}
KCLASYNC_DIR = os.path.dirname(kclasync.__file__)


class Window:
    """Process CPU and wall time between the first and the last record seen."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.seen = 0
        self.cpu0 = self.cpu1 = self.wall0 = self.wall1 = 0.0
        self.done = asyncio.Event()

    def add(self, n: int) -> None:
        if n and not self.seen:
            self.cpu0, self.wall0 = time.process_time(), time.perf_counter()
        self.seen += n
        if self.seen >= self.expected and not self.done.is_set():
            self.cpu1, self.wall1 = time.process_time(), time.perf_counter()
            self.done.set()

    @property
    def us_per_record(self) -> float:
        return (self.cpu1 - self.cpu0) / max(self.seen, 1) * 1e6


def stream_url(aws: LocalAws) -> str:
    return aws.kinesis_endpoint_url or aws.endpoint_url


async def produce(aws: LocalAws, stream: str, shards: int, records: int) -> None:
    session = get_session()
    async with session.create_client(
        "kinesis", region_name=REGION, endpoint_url=stream_url(aws), **CREDS
    ) as client:
        await client.create_stream(StreamName=stream, ShardCount=shards)
        while True:
            desc = await client.describe_stream_summary(StreamName=stream)
            if desc["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                break
            await asyncio.sleep(0.1)
        payload = b"x" * 90
        sem = asyncio.Semaphore(1)  # moto loses records under concurrent PutRecords

        async def put(start: int) -> None:
            batch = [
                {"PartitionKey": f"k{i}", "Data": payload + f"{i:010d}".encode()}
                for i in range(start, min(start + 500, records))
            ]
            async with sem:
                while batch:
                    resp = await client.put_records(StreamName=stream, Records=batch)
                    batch = [
                        rec
                        for rec, out in zip(batch, resp["Records"], strict=True)
                        if out.get("ErrorCode")
                    ]

        await asyncio.gather(*(put(s) for s in range(0, records, 500)))


async def bare_loop(aws: LocalAws, stream: str, records: int) -> Window:
    """What users write by hand: a default session, one GetRecords loop per shard."""
    window = Window(records)
    session = get_session()
    async with session.create_client(
        "kinesis", region_name=REGION, endpoint_url=stream_url(aws), **CREDS
    ) as client:
        shards = (await client.list_shards(StreamName=stream))["Shards"]

        async def read(shard_id: str) -> None:
            it = (
                await client.get_shard_iterator(
                    StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
                )
            )["ShardIterator"]
            while not window.done.is_set():
                resp = await client.get_records(ShardIterator=it, Limit=10000)
                got: Sequence[dict[str, object]] = resp["Records"]
                window.add(len(got))
                it = resp["NextShardIterator"]
                if not got:
                    await asyncio.sleep(0.05)

        tasks = [asyncio.create_task(read(s["ShardId"])) for s in shards]
        await window.done.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return window


async def kclasync_run(aws: LocalAws, stream: str, records: int) -> Window:
    window = Window(records)

    async def handle(batch: Sequence[Record]) -> None:
        window.add(len(batch))

    consumer = Consumer(
        stream_name=stream,
        application_name=f"bench-{uuid.uuid4().hex[:8]}",
        processor=handle,
        config=ConsumerConfig(initial_position="TRIM_HORIZON"),
        client_options=kclasync.ClientOptions(
            region_name=REGION,
            endpoint_url=aws.endpoint_url,
            kinesis_endpoint_url=aws.kinesis_endpoint_url,
            **CREDS,
        ),
    )
    task = asyncio.create_task(consumer.run())
    done = asyncio.create_task(window.done.wait())
    await asyncio.wait({task, done}, return_when=asyncio.FIRST_COMPLETED)
    await consumer.stop()
    await task
    return window


async def first_record(
    aws: LocalAws, stream: str, application: str, worker_id: str, *, crash: bool = False
) -> float:
    """Seconds from ``run()`` to the first record; ``crash``: cancel instead of stopping."""
    got = asyncio.Event()

    async def handle(batch: Sequence[Record]) -> None:
        if batch:
            got.set()

    consumer = Consumer(
        stream_name=stream,
        application_name=application,
        processor=handle,
        config=ConsumerConfig(initial_position="TRIM_HORIZON", worker_id=worker_id),
        client_options=kclasync.ClientOptions(
            region_name=REGION, endpoint_url=aws.endpoint_url, **CREDS
        ),
    )
    t0 = time.perf_counter()
    task = asyncio.create_task(consumer.run())
    waiter = asyncio.create_task(got.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED, timeout=60)
    elapsed = time.perf_counter() - t0
    if not got.is_set():
        task.cancel()
        raise RuntimeError("no record within 60 s")
    if crash:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    else:
        await consumer.stop()
        await task
    return elapsed


async def put_some(aws: LocalAws, stream: str, n: int = 20) -> None:
    """A few new records, so that a restarted worker has something after its checkpoint."""
    async with get_session().create_client(
        "kinesis", region_name=REGION, endpoint_url=stream_url(aws), **CREDS
    ) as client:
        await client.put_records(
            StreamName=stream,
            Records=[{"PartitionKey": f"p{i}", "Data": b"x" * 100} for i in range(n)],
        )


async def startup(args: argparse.Namespace) -> None:
    with moto_process() as aws:
        stream = f"bench-{uuid.uuid4().hex[:6]}"
        await produce(aws, stream, args.shards, 1000)
        async with get_session().create_client(
            "dynamodb", region_name=REGION, endpoint_url=aws.endpoint_url, **CREDS
        ) as ddb:
            await ddb.list_tables()  # moto loads its DynamoDB code on the first call
        names = ("empty table", "released leases", "after a crash")
        rows: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.rounds):
            app = f"start-{uuid.uuid4().hex[:8]}"
            rows["empty table"].append(await first_record(aws, stream, app, "w1"))
            await put_some(aws, stream)
            rows["released leases"].append(await first_record(aws, stream, app, "w1", crash=True))
            await put_some(aws, stream)
            rows["after a crash"].append(await first_record(aws, stream, app, "w1"))
    print(f"{'run() to first record, lone worker':<40}{'median s':>10}{'max s':>10}")
    for name, figures in rows.items():
        print(f"{name:<40}{statistics.median(figures):>10.2f}{max(figures):>10.2f}")


def own_share(profile: cProfile.Profile, records: int) -> tuple[float, float]:
    """(microseconds per record in kclasync's modules, share of all profiled time)."""
    stats = pstats.Stats(profile)
    own = total = 0.0
    for (filename, _line, _name), row in stats.stats.items():  # type: ignore[attr-defined]
        tottime = row[2]
        total += tottime
        if filename.startswith(KCLASYNC_DIR):
            own += tottime
    return own / max(records, 1) * 1e6, own / max(total, 1e-9)


async def main(args: argparse.Namespace) -> None:
    with contextlib.ExitStack() as stack:
        aws = stack.enter_context(moto_process())
        if args.kinesis_local:
            aws = stack.enter_context(kinesis_local(aws))
        stream = f"bench-{uuid.uuid4().hex[:6]}"
        t0 = time.perf_counter()
        await produce(aws, stream, args.shards, args.records)
        print(
            f"{args.records:,} records of ~100 B over {args.shards} shards written in "
            f"{time.perf_counter() - t0:.1f}s ("
            + ("kinesis-local" if args.kinesis_local else "moto")
            + " in its own process)"
        )
        bare: list[float] = []
        ours: list[float] = []
        for r in range(args.rounds):
            b = await bare_loop(aws, stream, args.records)
            k = await kclasync_run(aws, stream, args.records)
            bare.append(b.us_per_record)
            ours.append(k.us_per_record)
            print(
                f"  round {r + 1}: bare {b.us_per_record:5.1f} us/record "
                f"({b.wall1 - b.wall0:.2f}s wall), kclasync {k.us_per_record:5.1f} us/record "
                f"({k.wall1 - k.wall0:.2f}s wall)"
            )
        profile = cProfile.Profile()
        profile.enable()
        await kclasync_run(aws, stream, args.records)
        profile.disable()
        own_us, own_frac = own_share(profile, args.records)
    b_med, k_med = statistics.median(bare), statistics.median(ours)
    print()
    print(f"[{args.label}] kclasync from {KCLASYNC_DIR}")
    print(f"{'client CPU per record (median)':<40}{'us':>10}{'ratio':>10}")
    print(f"{'bare aiobotocore GetRecords loop':<40}{b_med:>10.1f}{1.0:>10.2f}")
    print(f"{'kclasync':<40}{k_med:>10.1f}{k_med / b_med:>10.2f}")
    # cProfile slows every call down, so its absolute times overstate; its share of the time
    # applied to the unprofiled CPU per record is the estimate of kclasync's own cost.
    print(
        f"{'kclasync own code':<40}{own_frac * k_med:>10.2f}"
        f"    ({own_frac:.1%} of the profiled time; {own_us:.1f} us under cProfile)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--kinesis-local",
        action="store_true",
        help="the stream on kinesis-local (keeps connections open), the lease table on moto",
    )
    parser.add_argument("--label", default="run", help="a name for this run in the output")
    parser.add_argument("--startup", action="store_true", help="run() to first record only")
    parser.add_argument("--idle", action="store_true", help="idle shards' cost (idle_shards.py)")
    if "--idle" in sys.argv[1:]:
        import idle_shards

        idle = argparse.ArgumentParser(description=idle_shards.__doc__.splitlines()[0])
        idle.add_argument("--idle", action="store_true")
        idle_shards.arguments(idle)
        asyncio.run(idle_shards.main(idle.parse_args()))
        sys.exit(0)
    cli = parser.parse_args()
    asyncio.run(startup(cli) if cli.startup else main(cli))
