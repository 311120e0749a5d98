"""Failover after SIGKILL: how long a killed worker's leases stay unprocessed, in failover times.

Two (``--workers``) worker processes (``kclasync._simulation.chaos_worker``) consume a stream on
moto's server (its own process). ``--kills`` times: wait until every worker holds leases, wait a
random moment, SIGKILL one worker holding leases, and time until every lease it held names
another worker (polled every 50 ms from this process), then start a replacement. Prints each
failover, the median, p90 and max as multiples of the failover time, the lease-table items the
workers read per lease-hour (counted in each worker process: items of full scans, keys from
the owner index, single-lease reads) next to the KCL 2.x's (one full scan every
2 x (failover + epsilon)), and the worker-registry reads and writes per worker-hour.
``--no-early-failover`` runs the workers with ``early_failover=False`` (scans only).

    uv run python benchmarks/failover.py [--kills 10] [--failover 3] [--shards 4] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from aiobotocore.session import get_session

from kclasync import ConsumerConfig
from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync.testing.emulators import LocalAws, moto_process

REGION = "us-east-1"
CREDS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}


def start_worker(
    aws: LocalAws, stream: str, worker_id: str, failover: float, out: str, early: bool
) -> subprocess.Popen[bytes]:
    log = open(out + ".log", "wb")  # noqa: SIM115 (kept open for the process's life)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kclasync._simulation.chaos_worker",
            "--endpoint-url",
            aws.endpoint_url,
            "--stream",
            stream,
            "--worker-id",
            worker_id,
            "--out",
            out,
            "--failover",
            str(failover),
            "--stats",
            out + ".stats",
            *(() if early else ("--no-early-failover",)),
        ],
        stdout=log,
        stderr=log,
    )


async def owners(store: DynamoLeaseStore) -> dict[str, str | None]:
    if not await table_exists(store):
        return {}
    return {lease.key: lease.owner for lease in (await store.list_leases()).leases}


async def table_exists(store: DynamoLeaseStore) -> bool:
    try:
        await store._client.describe_table(TableName=store.table_name)
    except store._client.exceptions.ResourceNotFoundException:
        return False
    return True


async def wait_for(pred, store: DynamoLeaseStore, timeout: float) -> dict[str, str | None]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        current = await owners(store)
        if pred(current):
            return current
        if time.monotonic() > deadline:
            raise TimeoutError(f"lease table stuck at {current}")
        await asyncio.sleep(0.05)


async def main(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    f = args.failover
    results: list[float] = []
    tmp = tempfile.mkdtemp(prefix="failover-")
    with moto_process() as aws:
        stream = f"fo-{uuid.uuid4().hex[:6]}"
        session = get_session()
        async with (
            session.create_client(
                "kinesis", region_name=REGION, endpoint_url=aws.endpoint_url, **CREDS
            ) as kin,
            session.create_client(
                "dynamodb", region_name=REGION, endpoint_url=aws.endpoint_url, **CREDS
            ) as ddb,
        ):
            await kin.create_stream(StreamName=stream, ShardCount=args.shards)
            store = DynamoLeaseStore(ddb, stream)
            procs: dict[str, subprocess.Popen[bytes]] = {}
            serial = 0

            def spawn() -> None:
                nonlocal serial
                serial += 1
                wid = f"w{serial}"
                procs[wid] = start_worker(
                    aws, stream, wid, f, os.path.join(tmp, f"{wid}.out"), not args.no_early_failover
                )

            try:
                for _ in range(args.workers):
                    spawn()
                for n in range(args.kills):
                    live = set(procs)
                    await wait_for(
                        lambda o, live=live: set(o.values()) == live and len(o) == args.shards,
                        store,
                        120,
                    )
                    await asyncio.sleep(rng.uniform(0, f))
                    current = await owners(store)
                    victim = rng.choice(sorted({w for w in current.values() if w}))
                    procs.pop(victim).send_signal(signal.SIGKILL)
                    killed = time.monotonic()
                    await wait_for(
                        lambda o, v=victim: all(w is not None and w != v for w in o.values()),
                        store,
                        20 * f,
                    )
                    took = time.monotonic() - killed
                    results.append(took / f)
                    print(f"  kill {n + 1}: {victim} failed over in {took:.2f}s = {took / f:.2f}x")
                    spawn()
            finally:
                await asyncio.sleep(1.2)  # the survivors' last statistics
                for proc in procs.values():
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                reads = read_counts(tmp, args.shards)
                if args.keep:
                    print(f"worker logs kept in {tmp}")
                else:
                    shutil.rmtree(tmp, ignore_errors=True)
    cfg = ConsumerConfig(failover_time=f, early_failover=not args.no_early_failover)
    kcl = 3600 / (2 * (f + cfg.epsilon))
    results.sort()
    p90 = results[min(len(results) - 1, round(0.9 * (len(results) - 1)))]
    print()
    print(f"failover time {f}s, {args.workers} workers, {args.shards} shards, {len(results)} kills")
    print(
        f"failover / failover_time: median {statistics.median(results):.2f}x, "
        f"p90 {p90:.2f}x, max {max(results):.2f}x"
    )
    ours = reads["taker_items_per_lease_hour"] + reads["early_items_per_lease_hour"]
    print(
        f"scan period {cfg.taker_interval:g}s, heartbeat period "
        f"{cfg.effective_heartbeat_interval or 'none (with renewals)'}"
    )
    print(
        f"lease items read per lease-hour by each worker to find expired leases: {ours:.0f} "
        f"(taker scans {reads['taker_items_per_lease_hour']:.0f}, early failover's single reads "
        f"and owner-index keys {reads['early_items_per_lease_hour']:.0f}; KCL 2.x scans: "
        f"{kcl:.0f}, ratio {ours / kcl:.2f}); besides: other scans (shard sync, start-up) "
        f"{reads['scan_items_per_lease_hour'] - reads['taker_items_per_lease_hour']:.0f}, "
        f"other single reads (refused writes, handoffs) {reads['other_items_per_lease_hour']:.0f}"
    )
    print(
        f"worker registry per worker-hour: {reads['registry_reads_per_worker_hour']:.0f} reads "
        f"(scans of {args.workers} items), {reads['registry_writes_per_worker_hour']:.0f} writes; "
        f"silences noticed {reads['silences']}, leases taken early {reads['early_takes']}"
    )


def read_counts(tmp: str, shards: int) -> dict[str, float]:
    """Pool the workers' last statistics files: lease items read per lease-hour (a worker's
    full scan reads every lease; single reads and owner-index keys one item each) and registry
    calls per worker-hour, over the workers' summed running time."""
    scans = taker = early = others = reg_reads = reg_writes = seconds = 0.0
    silences = takes = 0
    for path in glob.glob(os.path.join(tmp, "*.stats")):
        with open(path) as f:
            figures = json.load(f)
        lease = figures["lease_table"]
        scans += lease.get("scan", 0) * shards
        taker += figures["taker_rounds"] * shards
        early += figures["early_reads"] + figures["index_items"]
        others += lease.get("get_item", 0) - figures["early_reads"]
        reg_reads += figures["registry"].get("list_workers", 0)
        reg_writes += figures["registry"].get("report", 0)
        seconds += figures["seconds"]
        silences += figures["silences"]
        takes += figures["early_takes"]
    lease_hours = max(seconds, 1e-9) / 3600 * shards
    worker_hours = max(seconds, 1e-9) / 3600
    return {
        "lease_items_per_lease_hour": (scans + others) / lease_hours,
        "scan_items_per_lease_hour": scans / lease_hours,
        "taker_items_per_lease_hour": taker / lease_hours,
        "early_items_per_lease_hour": early / lease_hours,
        "other_items_per_lease_hour": others / lease_hours,
        "registry_reads_per_worker_hour": reg_reads / worker_hours,
        "registry_writes_per_worker_hour": reg_writes / worker_hours,
        "silences": silences,
        "early_takes": takes,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--failover", type=float, default=3.0)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the worker logs")
    parser.add_argument(
        "--no-early-failover", action="store_true", help="workers with early_failover=False"
    )
    asyncio.run(main(parser.parse_args()))
