"""The Java KCL's MultiLangDaemon against ``kclasync multilang``: the same properties, the same
processor script (``tests/interop/kcl_processor.py``, amazon_kclpy v3) and the same kind of
stream, one after the other in one run, on moto + kinesis-local (each implementation gets its
own stream and application).

For each implementation:

* start to first record: from starting worker A (its stream already holding ``--backlog``
  records) to the first record its processors wrote;
* CPU per record: after the backlog is processed, ``--records`` more are put and processed; the
  CPU time (user + system) of the worker process and of its children over that window, divided
  by the records (the worker alone, and the worker plus children);
* resident memory: the worker's RSS at the end of that window, and its children's together;
* failover: worker B starts; once B's entry is in ``<app>-WorkerMetricStats`` and the lease
  owners stood still for 3 s, A (worker and children) is killed with SIGKILL, and the time until
  every lease A held names another owner is divided by ``failoverTimeMillis``.

Ratios are kclasync's figure over Java's, measured in the same run. Prints a Markdown table.

    uv run python benchmarks/multilang.py [--shards 4] [--backlog 2000] [--records 4000]
        [--failover-ms 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import psutil

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kclasync._adapters.worker_registry import worker_metrics_table_name  # noqa: E402
from kclasync.testing.emulators import (  # noqa: E402
    REGION,
    LocalAws,
    find_kinesis_local,
    kinesis_local,
    moto_process,
)
from tests.interop.fleet import produce, read_deliveries  # noqa: E402
from tests.interop.java_kcl import FAST_PROPERTIES, MAIN_CLASS, kcl_jars  # noqa: E402
from tests.support import aws_for  # noqa: E402

PROCESSOR = ROOT / "tests" / "interop" / "kcl_processor.py"
KCLASYNC = pathlib.Path(sys.executable).parent / "kclasync"


def properties(local: LocalAws, stream: str, worker_id: str, failover_ms: int) -> str:
    props = {
        "executableName": f"{sys.executable} {PROCESSOR}",
        "streamName": stream,
        "applicationName": stream,
        "AWSCredentialsProvider": "DefaultCredentialsProvider",
        "processingLanguage": "python/3",
        "regionName": REGION,
        "kinesisEndpoint": local.kinesis_endpoint_url or local.endpoint_url,
        "dynamoDBEndpoint": local.endpoint_url,
        "workerId": worker_id,
        **FAST_PROPERTIES,
        "failoverTimeMillis": str(failover_ms),
    }
    return "".join(f"{k} = {v}\n" for k, v in props.items())


class Worker:
    def __init__(
        self,
        impl: str,
        local: LocalAws,
        stream: str,
        wid: str,
        work: pathlib.Path,
        failover_ms: int,
    ) -> None:
        self.impl, self.wid = impl, wid
        self.props = work / f"{wid}.properties"
        self.props.write_text(properties(local, stream, wid, failover_ms))
        self.out = work / f"{wid}.records"
        self.out.touch()
        self.log = work / f"{wid}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        if self.impl == "java":
            command = ["java", "-cp", f"{kcl_jars()}/*", MAIN_CLASS, "-p", str(self.props)]
        else:
            command = [str(KCLASYNC), "multilang", str(self.props)]
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_REGION": REGION,
            "KCL_INTEROP_OUT": str(self.out),
        }
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.props.parent,
                start_new_session=True,
            )
        return time.time()

    def tree(self) -> tuple[psutil.Process, list[psutil.Process]]:
        assert self.proc is not None
        root = psutil.Process(self.proc.pid)
        return root, root.children(recursive=True)

    def cpu(self) -> tuple[float, float]:
        """(worker, children) CPU seconds so far, of the live processes."""
        root, kids = self.tree()

        def used(p: psutil.Process) -> float:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                return t.user + t.system
            return 0.0

        return used(root), sum(used(k) for k in kids)

    def rss(self) -> tuple[float, float]:
        root, kids = self.tree()

        def mem(p: psutil.Process) -> float:
            with contextlib.suppress(psutil.Error):
                return p.memory_info().rss / 2**20
            return 0.0

        return mem(root), sum(mem(k) for k in kids)

    def kill(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pids = [p.pid for p in self.tree()[1]]
        os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in pids:  # kclasync's children run in their own process groups
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()

    def records(self) -> set[tuple[str, int]]:
        return {d.rid for d in read_deliveries(self.out, self.wid)}

    def first_record_at(self) -> float | None:
        ds = read_deliveries(self.out, self.wid)
        return min((d.at for d in ds), default=None)


async def until(pred: Any, timeout: float, what: str, period: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(period)


async def run_one(
    impl: str, local: LocalAws, args: argparse.Namespace, work: pathlib.Path
) -> dict[str, float]:
    name = f"ml-bench-{impl}-{uuid.uuid4().hex[:6]}"
    out: dict[str, float] = {}
    async with aws_for(local, name) as aws:
        await aws.create_stream(args.shards)
        sent = await produce(aws, 0, args.backlog)
        a = Worker(impl, local, name, f"{impl}-a", work, args.failover_ms)
        b = Worker(impl, local, name, f"{impl}-b", work, args.failover_ms)
        try:
            started = a.start()
            await until(lambda: a.first_record_at() is not None, 300, f"{impl}: first record")
            out["first_record_s"] = (a.first_record_at() or 0) - started
            await until(lambda: sent <= a.records(), 300, f"{impl}: the backlog")
            cpu0 = a.cpu()
            more = await produce(aws, args.backlog, args.records)
            await until(lambda: more <= a.records(), 300, f"{impl}: the measured records")
            cpu1 = a.cpu()
            out["cpu_worker_us"] = (cpu1[0] - cpu0[0]) / args.records * 1e6
            out["cpu_total_us"] = (sum(cpu1) - sum(cpu0)) / args.records * 1e6
            out["rss_worker_mib"], out["rss_children_mib"] = a.rss()
            b.start()
            metrics = worker_metrics_table_name(name)

            async def b_registered() -> bool:
                with contextlib.suppress(Exception):
                    raw = await aws.dynamodb.get_item(
                        TableName=metrics, Key={"wid": {"S": b.wid}}, ConsistentRead=True
                    )
                    return "Item" in raw
                return False

            await until(b_registered, 300, f"{impl}: worker b to register", 0.5)
            last: dict[str, str | None] = {}
            still_since = time.monotonic()
            while time.monotonic() - still_since < 3.0:
                owners = {
                    lease.key: lease.owner
                    for lease in (await aws.store.list_leases()).leases
                    if not lease.checkpoint.is_shard_end
                }
                if owners != last:
                    last, still_since = owners, time.monotonic()
                await asyncio.sleep(0.2)
            held = {k for k, o in last.items() if o == a.wid}
            a.kill()
            killed = time.monotonic()

            async def moved() -> bool:
                leases = (await aws.store.list_leases()).leases
                return all(
                    lease.owner not in (None, a.wid) for lease in leases if lease.key in held
                )

            await until(moved, 400, f"{impl}: a's leases to move", 0.1)
            out["failover_x"] = (time.monotonic() - killed) / (args.failover_ms / 1000)
            out["leases_moved"] = len(held)
        finally:
            a.stop()
            b.stop()
    return out


async def main(args: argparse.Namespace) -> None:
    if kcl_jars() is None:
        raise SystemExit("needs the kclpy-ext wheel (dev dependency) and java")
    script = find_kinesis_local(str(ROOT))
    assert script is not None, "run `npm ci` first (kinesis-local)"
    with (
        tempfile.TemporaryDirectory() as tmp,
        moto_process() as moto,
        kinesis_local(moto, script=script) as local,
    ):
        results = {}
        for impl in args.impls.split(","):
            print(f"running {impl} ...", file=sys.stderr, flush=True)
            results[impl] = await run_one(impl, local, args, pathlib.Path(tmp))
    if len(results) < 2:
        print(results)
        return
    j, k = results["java"], results["kclasync"]
    rows = [
        ("start to first record", "first_record_s", "{:.1f} s"),
        ("CPU per record, worker", "cpu_worker_us", "{:.0f} us"),
        ("CPU per record, worker + children", "cpu_total_us", "{:.0f} us"),
        ("resident memory, worker", "rss_worker_mib", "{:.0f} MiB"),
        ("resident memory, children", "rss_children_mib", "{:.0f} MiB"),
        ("failover after SIGKILL (x failoverTimeMillis)", "failover_x", "{:.2f}"),
    ]
    print(
        f"\n{args.shards} shards, {args.backlog} records before start, {args.records} "
        f"measured, failoverTimeMillis {args.failover_ms}; leases moved: "
        f"Java {j['leases_moved']:.0f}, kclasync {k['leases_moved']:.0f}\n"
    )
    print("| | Java MultiLangDaemon | kclasync multilang | kclasync / Java |")
    print("|---|---|---|---|")
    for label, key, fmt in rows:
        ratio = k[key] / j[key] if j[key] else float("nan")
        print(f"| {label} | {fmt.format(j[key])} | {fmt.format(k[key])} | {ratio:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--backlog", type=int, default=2000)
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--failover-ms", type=int, default=5000)
    parser.add_argument(
        "--impls", default="java,kclasync", help="which to run (both for the table)"
    )
    asyncio.run(main(parser.parse_args()))
