"""How one worker's cost grows with the shards it holds: 100, 500, 1,000 and 2,000 shards, idle
and at 1 record/s per shard.

    uv run python benchmarks/scale_worker.py [--shards 100,500,1000,2000] [--rates 0,1]
        [--failover 60] [--warmup 20] [--window 60] [--max-reads-in-flight 32]
        [--plot docs/scale_worker.png]

Kinesis is ``benchmarks/fake_kinesis.py`` (one process per point, the service's JSON wire
format, records generated from memory: moto and kinesis-local cannot serve 2,000 shards' reads
on this machine without becoming the bottleneck); DynamoDB is ``benchmarks/fake_dynamodb.py``
(``--dynamodb-standin moto`` for moto's server, which checks every condition but cannot take
2,000 checkpoints a second).
Each point runs in a fresh Python process of its own (``--point``), so resident memory is that
point's: the process starts, notes its resident memory, starts a worker with a new lease table,
waits until it holds every lease, lets ``--warmup`` seconds pass, then measures over
``--window`` seconds:

* the worker process's CPU (% of one core; the Kinesis and DynamoDB stand-ins are other
  processes), and that per shard;
* resident memory (VmRSS) beyond the process's before the worker started, and per shard;
* event-loop lag: a probe task sleeps 50 ms in a loop and records how late it wakes (p50, p99,
  max);
* renewal lateness: how long after its round was due each renewal was sent (p99, max), as a
  share of the failover time (``LeaseRenewals._sent_late`` is wrapped to collect every sample);
* leases lost while the worker was alive (must be 0), and records processed per second.

The failover time is ``--failover`` (60 s by default, so that moto can also answer 2,000
renewals per 20 s; renewals' share of a core scales with leases / failover time). With
``--plot``, CPU and memory against shards are drawn with matplotlib (dev dependency).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REGION = "us-east-1"


def rss_kb() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_port() -> int:
    from kclasync.testing.emulators import free_port as port

    return port()


async def point(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement, in this process (``--point``)."""
    from prometheus_client import CollectorRegistry

    from kclasync import ClientOptions, Consumer, ConsumerConfig

    base_rss = rss_kb()
    shards, rate = args.point_shards, args.point_rate
    port = free_port()
    stream = f"scale-{uuid.uuid4().hex[:8]}"
    fake = await asyncio.create_subprocess_exec(
        sys.executable,
        os.path.join(ROOT, "benchmarks", "fake_kinesis.py"),
        str(port),
        stream,
        str(shards),
        str(rate),
    )
    processed = 0

    async def handle(batch: Sequence[Any]) -> None:
        nonlocal processed
        processed += len(batch)

    consumer = Consumer(
        stream_name=stream,
        application_name=f"scale-{uuid.uuid4().hex[:8]}",
        processor=handle,
        config=ConsumerConfig(
            failover_time=args.failover,
            initial_position="LATEST",
            lease_taker="balanced",
            max_reads_in_flight=args.max_reads_in_flight or None,
            renewals_first=not args.no_renewals_first,
        ),
        client_options=ClientOptions(
            region_name=REGION,
            kinesis_endpoint_url=f"http://127.0.0.1:{port}",
            dynamodb_endpoint_url=args.dynamodb,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ),
        registry=CollectorRegistry(),
    )
    lags: list[float] = []
    lateness: list[float] = []
    measuring = False
    stop_probe = asyncio.Event()

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        while not stop_probe.is_set():
            t0 = loop.time()
            await asyncio.sleep(0.05)
            if measuring:
                lags.append(loop.time() - t0 - 0.05)

    def lost() -> float:
        return sum(
            s.value
            for fam in consumer.metrics.leases_lost.collect()
            for s in fam.samples
            if s.name.endswith("_total")
        )

    try:
        await asyncio.sleep(0.5)  # the stand-in starts
        task = asyncio.create_task(consumer.run())
        probing = asyncio.create_task(probe())
        started = time.perf_counter()
        while len(consumer.held_leases) < shards:
            if task.done():
                await task
            if time.perf_counter() - started > args.take_limit:
                raise RuntimeError(f"only {len(consumer.held_leases)} of {shards} leases held")
            await asyncio.sleep(0.5)
        took = time.perf_counter() - started
        coordinator = consumer._coordinator
        assert coordinator is not None
        renewals = coordinator.renewals
        inner = renewals._sent_late

        def collect(due: float | None, sent: float) -> None:
            if measuring and due is not None:
                lateness.append(max(0.0, sent - due))
            inner(due, sent)

        renewals._sent_late = collect  # type: ignore[method-assign]
        await asyncio.sleep(args.warmup)
        lost0, done0 = lost(), processed
        measuring = True
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(args.window)
        cpu1, wall1 = time.process_time(), time.perf_counter()
        measuring = False
        rss = rss_kb()
        worker = consumer._worker
        slots = worker.supervisor.read_slots if worker is not None else None
        result = {
            "shards": shards,
            "rate": rate,
            "held": len(consumer.held_leases),
            "take_s": took,
            "cpu_pct": 100 * (cpu1 - cpu0) / (wall1 - wall0),
            "rss_mb": (rss - base_rss) / 1024,
            "rss_kb_per_shard": (rss - base_rss) / shards,
            "lag_p50_ms": 1000 * pct(lags, 0.5),
            "lag_p99_ms": 1000 * pct(lags, 0.99),
            "lag_max_ms": 1000 * max(lags, default=0.0),
            "late_p99": pct(lateness, 0.99) / args.failover,
            "late_max": max(lateness, default=0.0) / args.failover,
            "renewals": len(lateness),
            "lost": lost() - lost0,
            "records_s": (processed - done0) / (wall1 - wall0),
            # GetRecords allowed in flight at the window's end, and the lowest it went.
            "reads_limit": slots.limit if slots is not None else None,
            "reads_lowest": slots.lowest if slots is not None else None,
        }
        stop_probe.set()
        await consumer.stop()
        await task
        probing.cancel()
        return result
    finally:
        fake.terminate()
        await fake.wait()


def run_points(args: argparse.Namespace) -> list[dict[str, Any]]:
    with dynamodb(args.dynamodb_standin) as endpoint:
        results = []
        for rate in [float(r) for r in args.rates.split(",")]:
            for shards in [int(s) for s in args.shards.split(",")]:
                cmd = [
                    *(sys.executable, __file__, "--point", str(shards), str(rate)),
                    *("--dynamodb", endpoint, "--failover", str(args.failover)),
                    *("--warmup", str(args.warmup), "--window", str(args.window)),
                    *("--max-reads-in-flight", str(args.max_reads_in_flight)),
                    *(("--no-renewals-first",) if args.no_renewals_first else ()),
                ]
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
                if out.returncode != 0 or not line.startswith("{"):
                    print(out.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"point {shards} shards, {rate}/s failed")
                result = json.loads(line)
                results.append(result)
                print(row(result), flush=True)
    return results


@contextlib.contextmanager
def dynamodb(kind: str) -> Iterator[str]:
    """The DynamoDB endpoint: ``fake`` (``fake_dynamodb.py``, conditions not checked) or
    ``moto`` (moto's server: every condition checked, ~6 ms per write)."""
    if kind == "moto":
        from kclasync.testing.emulators import moto_process

        with moto_process() as aws:
            yield aws.endpoint_url
        return
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "benchmarks", "fake_dynamodb.py"), str(port)]
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket_probe(port) as up:
                if up:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("the DynamoDB stand-in did not start")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def socket_probe(port: int) -> Iterator[bool]:
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
    except urllib.error.HTTPError:
        yield True  # it answers (405 for a GET)
    except OSError:
        yield False
    else:
        yield True


HEADER = (
    "| shards | rec/s/shard | CPU % of a core | CPU % per 100 shards | RSS MB | KB/shard | "
    "loop lag p50/p99/max ms | renewal late p99/max (x failover) | lost | records/s |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def row(r: dict[str, Any]) -> str:
    return (
        f"| {r['shards']} | {r['rate']:g} | {r['cpu_pct']:.1f} | "
        f"{100 * r['cpu_pct'] / r['shards']:.2f} | {r['rss_mb']:.0f} | "
        f"{r['rss_kb_per_shard']:.1f} | {r['lag_p50_ms']:.1f}/{r['lag_p99_ms']:.1f}/"
        f"{r['lag_max_ms']:.0f} | {r['late_p99']:.3f}/{r['late_max']:.3f} | {r['lost']:g} | "
        f"{r['records_s']:.0f} | {r.get('reads_limit')}/{r.get('reads_lowest')} |"
    )


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cpu, mem) = plt.subplots(1, 2, figsize=(10, 4))
    for rate in sorted({r["rate"] for r in results}):
        pts = sorted((r for r in results if r["rate"] == rate), key=lambda r: r["shards"])
        label = "idle" if rate == 0 else f"{rate:g} record/s per shard"
        cpu.plot([p["shards"] for p in pts], [p["cpu_pct"] for p in pts], "o-", label=label)
        mem.plot([p["shards"] for p in pts], [p["rss_mb"] for p in pts], "o-", label=label)
    cpu.set(xlabel="shards held by one worker", ylabel="CPU, % of one core", title="CPU")
    mem.set(xlabel="shards held by one worker", ylabel="resident memory, MB", title="Memory")
    for ax in (cpu, mem):
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="100,500,1000,2000")
    parser.add_argument("--rates", default="0,1")
    parser.add_argument("--failover", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument(
        "--dynamodb-standin",
        choices=("fake", "moto"),
        default="fake",
        help="fake: fake_dynamodb.py (fast, conditions not checked); moto: every condition",
    )
    parser.add_argument("--take-limit", type=float, default=600.0)
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument(
        "--max-reads-in-flight", type=int, default=32, help="the worker's setting (0: no bound)"
    )
    parser.add_argument(
        "--no-renewals-first",
        action="store_true",
        help="the worker's renewals_first=False: reads in flight stay at the bound",
    )
    parser.add_argument("--plot", default=None, help="write a PNG of CPU and memory vs shards")
    parser.add_argument("--point", nargs=2, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dynamodb", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.point is not None:
        args.point_shards, args.point_rate = int(args.point[0]), float(args.point[1])
        print(json.dumps(asyncio.run(point(args))))
        return
    print(HEADER, flush=True)
    results = run_points(args)
    if args.plot:
        plot(results, args.plot)
    idle = sorted((r for r in results if r["rate"] == 0), key=lambda r: r["shards"])
    if len(idle) >= 2:
        slope = (
            (idle[-1]["rss_mb"] - idle[0]["rss_mb"])
            * 1024
            / (idle[-1]["shards"] - idle[0]["shards"])
        )
        print(f"\nidle memory slope: {slope:.1f} KB per shard beyond the first point")
        print(
            "idle CPU per 100 shards: "
            + ", ".join(f"{100 * r['cpu_pct'] / r['shards']:.2f}" for r in idle)
        )


if __name__ == "__main__":
    main()
