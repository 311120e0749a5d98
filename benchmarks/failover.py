"""Failover after SIGKILL: how long a killed worker's leases stay unprocessed, in failover times.

Two (``--workers``) worker processes (``kclasync._simulation.chaos_worker``) consume a stream on
moto's server (its own process). ``--kills`` times: wait until every worker holds leases, wait a
random moment, SIGKILL one worker holding leases, and time until every lease it held names
another worker (polled every 50 ms from this process), then start a replacement. Prints each
failover, the median, p90 and max as multiples of the failover time, and the lease-table items
the workers read per worker and lease-hour (counted in each worker process: every lease of a
full scan, each key from the owner index, each strong single read) by cause: the taker's
start-up, periodic and woken scans, and early failover's reads by how each follow of a silent
worker ended (a dead worker's leases, a false alarm, leases others took first). They are given
for the steady-state windows (``--spacing`` seconds with every lease held, before each kill's
random moment: what a fleet where crashes are rare reads) and over the workers' whole lives,
next to the KCL 2.x's (one full scan every 2 x (failover + epsilon), plus one at start), then
per worker lifetime, and the worker-registry reads and writes per worker-hour.
``--no-early-failover`` runs the workers with ``early_failover=False`` (scans only).

    uv run python benchmarks/failover.py [--kills 10] [--failover 3] [--shards 4] [--workers 2]
        [--spacing 0]
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
    steady: list[dict[str, float]] = []  # per window: summed item deltas and worker-seconds
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
                    await asyncio.sleep(1.0)  # the statistics files lag up to half a second
                    before = snapshot(tmp, live)
                    await asyncio.sleep(args.spacing + rng.uniform(0, f))
                    steady.append(window(before, snapshot(tmp, live), args.shards))
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
                lifetimes = snapshot(tmp, None)
                if args.keep:
                    print(f"worker logs kept in {tmp}")
                else:
                    shutil.rmtree(tmp, ignore_errors=True)
    report(args, results, steady, lifetimes)


def report(
    args: argparse.Namespace,
    results: list[float],
    steady: list[dict[str, float]],
    lifetimes: dict[str, dict[str, object]],
) -> None:
    f = args.failover
    cfg = ConsumerConfig(failover_time=f, early_failover=not args.no_early_failover)
    period = 2 * (f + cfg.epsilon)
    kcl = 3600 / period
    results.sort()
    p90 = results[min(len(results) - 1, round(0.9 * (len(results) - 1)))]
    print()
    print(
        f"failover time {f}s, {args.workers} workers, {args.shards} shards, {len(results)} kills, "
        f"{args.spacing:g}s of steady state before each kill"
    )
    print(
        f"failover / failover_time: median {statistics.median(results):.2f}x, "
        f"p90 {p90:.2f}x, max {max(results):.2f}x"
    )
    print(
        f"scan period {cfg.taker_interval:g}s, heartbeat period "
        f"{cfg.effective_heartbeat_interval or 'none (with renewals)'}"
    )
    print()
    print("lease-table items read per worker and lease-hour, by cause")
    total = {k: 0.0 for k in CAUSES}
    seconds = 0.0
    kcl_items = 0.0
    rows = []
    for wid in sorted(lifetimes, key=lambda w: int(w[1:])):
        figures = lifetimes[wid]
        items = item_counts(figures, args.shards)
        for k in CAUSES:
            total[k] += items[k]
        secs = float(figures["seconds"])  # type: ignore[arg-type]
        seconds += secs
        kcl_items += (1 + secs // period) * args.shards  # its start-up scan, then one per period
        rows.append((wid, secs, items))
    steady_total = {k: sum(w[k] for w in steady) for k in (*CAUSES, "seconds")}
    print(f"  {'cause':<34}{'steady state':>14}{'overall':>10}")
    for k in CAUSES:
        in_steady = per_lease_hour(steady_total[k], steady_total["seconds"], args)
        overall = per_lease_hour(total[k], seconds, args)
        print(f"  {LABELS[k]:<34}{in_steady:>14.0f}{overall:>10.0f}")
    ours_steady = sum(steady_total[k] for k in BUDGET)
    ours = sum(total[k] for k in BUDGET)
    rate_steady = per_lease_hour(ours_steady, steady_total["seconds"], args)
    rate = per_lease_hour(ours, seconds, args)
    kcl_overall = per_lease_hour(kcl_items, seconds, args)
    print(
        f"  finding expired leases (scans of the taker + early failover): steady {rate_steady:.0f} "
        f"= {rate_steady / kcl:.2f}x the KCL 2.x's {kcl:.0f}; overall {rate:.0f} = "
        f"{rate / kcl_overall:.2f}x the KCL's {kcl_overall:.0f} with its start-up scans "
        f"({rate / kcl:.2f}x its steady rate)"
    )
    print(
        f"  steady-state windows: {len(steady)}, {steady_total['seconds']:.0f} worker-seconds; "
        f"lifetimes: {len(rows)} workers, {seconds:.0f} worker-seconds"
    )
    print()
    print("per worker lifetime (items): start-up scan, periodic, woken, early failover by outcome")
    for wid, secs, items in rows:
        figures = lifetimes[wid]
        print(
            f"  {wid:>4} {secs:6.0f}s  start {items['startup_scan']:3.0f}  periodic "
            f"{items['periodic_scan']:4.0f}  woken {items['woken_scan']:3.0f}  failover "
            f"{items['early_failover']:3.0f}  false alarms {items['false_alarm']:3.0f}  other "
            f"{items['early_other']:3.0f}  | empty owner queries {items['empty_queries']:.0f}, "
            f"silences skipped {figures.get('skipped_silences', 0)}, "
            f"follows {figures.get('follows_by_outcome', {})}"
        )
    reg_reads = sum(float(x["registry"].get("list_workers", 0)) for x in lifetimes.values())  # type: ignore[attr-defined]
    reg_writes = sum(float(x["registry"].get("report", 0)) for x in lifetimes.values())  # type: ignore[attr-defined]
    hours = max(seconds, 1e-9) / 3600
    print(
        f"worker registry per worker-hour: {reg_reads / hours:.0f} reads, "
        f"{reg_writes / hours:.0f} writes; load average at the end {os.getloadavg()}"
    )


#: Lease items read, by cause (owner-index keys and strong single reads count one item each; a
#: full scan counts every lease). ``empty_queries``: owner-index queries that found no key
#: (requests, no items).
CAUSES = (
    "startup_scan",
    "periodic_scan",
    "woken_scan",
    "early_failover",
    "false_alarm",
    "early_other",
    "other_scan",
    "other_get",
    "empty_queries",
)
#: The reads spent finding expired leases, compared with the KCL 2.x's scans.
BUDGET = (
    "startup_scan",
    "periodic_scan",
    "woken_scan",
    "early_failover",
    "false_alarm",
    "early_other",
)
LABELS = {
    "startup_scan": "taker: start-up scan",
    "periodic_scan": "taker: periodic scans",
    "woken_scan": "taker: scans on wake-up",
    "early_failover": "early: leases of a dead worker",
    "false_alarm": "early: false alarms",
    "early_other": "early: taken/released by others",
    "other_scan": "(other scans: shard sync)",
    "other_get": "(other single reads)",
    "empty_queries": "(empty owner queries, requests)",
}


def item_counts(figures: dict[str, object], shards: int) -> dict[str, float]:
    lease: dict[str, int] = figures["lease_table"]  # type: ignore[assignment]
    causes: dict[str, int] = figures.get("round_causes") or {}  # type: ignore[assignment]
    reads: dict[str, int] = figures.get("reads_by_outcome") or {}  # type: ignore[assignment]
    follows: dict[str, int] = figures.get("follows_by_outcome") or {}  # type: ignore[assignment]
    rounds = int(figures["taker_rounds"])  # type: ignore[call-overload]
    return {
        "startup_scan": causes.get("startup", 0) * shards,
        "periodic_scan": causes.get("periodic", 0) * shards,
        "woken_scan": causes.get("woken", 0) * shards,
        "early_failover": reads.get("failover", 0),
        "false_alarm": reads.get("false_alarm", 0),
        "early_other": reads.get("other", 0) + reads.get("no_leases", 0),
        "other_scan": (lease.get("scan", 0) - rounds) * shards,
        "other_get": lease.get("get_item", 0) - int(figures["early_reads"]),  # type: ignore[call-overload]
        "empty_queries": follows.get("no_leases", 0),
    }


def per_lease_hour(items: float, worker_seconds: float, args: argparse.Namespace) -> float:
    return items / (max(worker_seconds, 1e-9) / 3600 * args.shards)


def snapshot(tmp: str, workers: set[str] | None) -> dict[str, dict[str, object]]:
    """The workers' statistics files as they are now (written every half second)."""
    found: dict[str, dict[str, object]] = {}
    for path in glob.glob(os.path.join(tmp, "*.stats")):
        wid = os.path.basename(path).split(".")[0]
        if workers is None or wid in workers:
            with open(path) as f:
                found[wid] = json.load(f)
    return found


def window(
    before: dict[str, dict[str, object]], after: dict[str, dict[str, object]], shards: int
) -> dict[str, float]:
    """Items read by cause and worker-seconds between two snapshots, over the workers in both."""
    out = dict.fromkeys((*CAUSES, "seconds"), 0.0)
    for wid in before.keys() & after.keys():
        a, b = item_counts(before[wid], shards), item_counts(after[wid], shards)
        for k in CAUSES:
            out[k] += b[k] - a[k]
        out["seconds"] += float(after[wid]["seconds"]) - float(before[wid]["seconds"])  # type: ignore[arg-type]
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--failover", type=float, default=3.0)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--spacing",
        type=float,
        default=0.0,
        help="seconds of steady state (all leases held, no kill) before each kill's random moment",
    )
    parser.add_argument("--keep", action="store_true", help="keep the worker logs")
    parser.add_argument(
        "--no-early-failover", action="store_true", help="workers with early_failover=False"
    )
    asyncio.run(main(parser.parse_args()))
