"""The AWS calls of one warm query of the Spark ``kinesis`` source against the plain loop's, by
action, and what each kind of call costs moto's server: where a small backlog's batch goes
beyond the reads.

    flock /tmp/heavy.lock uv run python benchmarks/spark_calls.py [--shards 64] [--records 20000]
        [--group 32]

Starts moto's server with its request recorder (``/moto-api/recorder``), writes the backlog,
starts a ``local[2]`` session, runs a warm-up query, then records the requests of the plain
loop (``spark_throughput.plain_loop``) and of one timed query with ``shardsPerTask=--group``
(AvailableNow into ``noop``), and counts them by action (the ``X-Amz-Target`` header). Then,
with the recorder off, it times ``--calls`` sequential calls of each kind the source makes and
samples moto's CPU meanwhile (``spark_probes.ServerCpu``): milliseconds of moto's time per
call. Calls times cost is what the query asks of the server that the plain loop does not.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from kclasync.testing.emulators import LocalAws, moto_process

# Run as a script: its directory is on the path.
from spark_probes import ServerCpu, _descendants  # isort: skip
from spark_throughput import backlog, plain_loop, source_run, start_session  # isort: skip

TABLE = "calls-probe"


def recorder(local: LocalAws, what: str) -> bytes:
    url = f"{local.endpoint_url}/moto-api/recorder/{what}"
    method = "GET" if what == "download-recording" else "POST"
    with urllib.request.urlopen(urllib.request.Request(url, method=method)) as resp:
        body: bytes = resp.read()
        return body


def counted(local: LocalAws, run: Callable[[], object]) -> collections.Counter[str]:
    """Requests moto received while ``run()`` ran, by action."""
    recorder(local, "reset-recording")
    recorder(local, "start-recording")
    try:
        run()
    finally:
        recorder(local, "stop-recording")
    counts: collections.Counter[str] = collections.Counter()
    for line in recorder(local, "download-recording").decode().splitlines():
        if line.strip():
            headers = {k.lower(): v for k, v in json.loads(line)["headers"].items()}
            counts[headers.get("x-amz-target", "?").split(".")[-1]] += 1
    return counts


async def call_costs(local: LocalAws, stream: str, n: int, cpu: ServerCpu) -> dict[str, float]:
    """Milliseconds of moto's CPU per call, ``n`` sequential calls of each kind."""
    options = local.client_options()
    costs: dict[str, float] = {}
    async with (
        options.create_client("kinesis") as kinesis,
        options.create_client("dynamodb") as ddb,
    ):
        shard = (await kinesis.list_shards(StreamName=stream))["Shards"][0]["ShardId"]
        await ddb.create_table(
            TableName=TABLE,
            KeySchema=[
                {"AttributeName": "run", "KeyType": "HASH"},
                {"AttributeName": "item", "KeyType": "RANGE"},
            ],
            AttributeDefinitions=[
                {"AttributeName": "run", "AttributeType": "S"},
                {"AttributeName": "item", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
        it = (
            await kinesis.get_shard_iterator(
                StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
            )
        )["ShardIterator"]
        key = {"run": {"S": "r"}, "item": {"S": "0"}}

        async def put(i: int) -> None:
            await ddb.put_item(
                TableName=TABLE,
                Item={"run": {"S": "r"}, "item": {"S": f"{i:08d}"}, "b": {"S": "x" * 120}},
                ConditionExpression="attribute_not_exists(#r)",
                ExpressionAttributeNames={"#r": "run"},
            )

        kinds: dict[str, Callable[[int], Awaitable[Any]]] = {
            "GetShardIterator": lambda i: kinesis.get_shard_iterator(
                StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
            ),
            "GetRecords(Limit=2)": lambda i: kinesis.get_records(ShardIterator=it, Limit=2),
            "PutItem (conditional)": put,
            "GetItem": lambda i: ddb.get_item(TableName=TABLE, Key=key, ConsistentRead=True),
            "Query (one batch)": lambda i: ddb.query(
                TableName=TABLE,
                KeyConditionExpression="#r = :r AND begins_with(#i, :p)",
                ExpressionAttributeNames={"#r": "run", "#i": "item"},
                ExpressionAttributeValues={":r": {"S": "r"}, ":p": {"S": "0000001"}},
                ConsistentRead=True,
            ),
        }
        for name, call in kinds.items():
            await call(-1)
            await asyncio.sleep(0.05)
            started = time.monotonic()
            for i in range(n):
                await call(i)
            ended = time.monotonic()
            await asyncio.sleep(0.05)
            costs[name] = 1000 * cpu.used(started, ended) / n
            print(
                f"  {name:<24} {1000 * (ended - started) / n:6.2f} ms wall, "
                f"{costs[name]:6.2f} ms of moto's CPU per call"
            )
    return costs


@contextlib.contextmanager
def sampled(out: str) -> Iterator[None]:
    """py-spy (``uvx py-spy record``) on the executors' Python daemon and its workers."""
    daemon = next(pid for pid, what in _descendants().items() if what == "pyspark.daemon")
    cmd = ["uvx", "py-spy", "record", "--pid", str(daemon), "--subprocesses", "--idle"]
    cmd += ["--format", "raw", "--rate", "200", "--nonblocking", "-o", out]
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(2.0)  # py-spy attaches
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=60)
        print(f"py-spy: {err.decode(errors='replace').strip()[-300:]}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--group", type=int, default=32, help="shardsPerTask of the timed query")
    parser.add_argument("--calls", type=int, default=200, help="calls timed per kind")
    parser.add_argument(
        "--pyspy",
        metavar="FILE",
        help="also run one more query (on a second stream like the first) with py-spy sampling "
        "the executors' Python workers, idle time included; collapsed stacks to FILE",
    )
    parser.add_argument(
        "--costs-only", action="store_true", help="only time each kind of call (no Spark)"
    )
    args = parser.parse_args()
    if args.costs_only:
        with moto_process(timeout=120) as local:
            asyncio.run(backlog(local, "calls", 1, 100))
            cpu = ServerCpu()
            print(f"moto's time per call ({args.calls} sequential calls each):")
            asyncio.run(call_costs(local, "calls", args.calls, cpu))
            cpu.stop()
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MOTO_RECORDER_FILEPATH"] = os.path.join(tmp, "recording")
        with moto_process(timeout=120) as local:
            asyncio.run(backlog(local, "calls", args.shards, args.records, args.records))
            asyncio.run(backlog(local, "warmup", 4, 400))
            spark = start_session()
            try:
                source_run(spark, local, "warmup", tmp, "noop", 1, args.group)
                plain = counted(local, lambda: asyncio.run(plain_loop(local, "calls")))
                query = counted(
                    local, lambda: source_run(spark, local, "calls", tmp, "noop", 2, args.group)
                )
                if args.pyspy:
                    asyncio.run(backlog(local, "profiled", args.shards, args.records, args.records))
                    with sampled(args.pyspy):
                        source_run(spark, local, "profiled", tmp, "noop", 3, args.group)
            finally:
                spark.stop()
            cpu = ServerCpu()
            print(f"moto's time per call ({args.calls} sequential calls each):")
            costs = asyncio.run(call_costs(local, "calls", args.calls, cpu))
            cpu.stop()
    print(
        f"requests by action, {args.shards} shards, {args.records:,} records, "
        f"shardsPerTask={args.group}:"
    )
    print(f"  {'action':<22}{'plain loop':>11}{'query':>8}")
    for action in sorted(set(plain) | set(query)):
        print(f"  {action:<22}{plain[action]:>11}{query[action]:>8}")
    print(f"  {'total':<22}{sum(plain.values()):>11}{sum(query.values()):>8}")
    print({k: round(v, 2) for k, v in costs.items()})


if __name__ == "__main__":
    main()
