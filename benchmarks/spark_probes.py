"""Helpers of ``benchmarks/spark_throughput.py``: the processes a Spark query starts (from
/proc), the source's driver calls timed one by one (``--driver``) and cProfile over one
executor-side read (``--profile``).
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import pstats
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync.testing.emulators import LocalAws

AWS = {"region": "us-east-1", "awsAccessKeyId": "testing", "awsSecretKey": "testing"}


def _descendants() -> dict[int, str]:
    """This process's descendants (pid -> what runs in it), from /proc."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        parents[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
        words = [a.decode(errors="replace") for a in argv if a]
        module = [w for w in words if w.startswith("pyspark.")]
        program = os.path.basename(words[0]) if words else "?"
        commands[int(entry)] = module[-1] if module else program
    mine = {os.getpid()}
    changed = True
    while changed:
        changed = False
        for pid, parent in parents.items():
            if parent in mine and pid not in mine:
                mine.add(pid)
                changed = True
    mine.discard(os.getpid())
    return {pid: commands[pid] for pid in mine}


@contextmanager
def new_processes() -> Iterator[dict[int, str]]:
    """The processes this process's tree starts inside the block (sampled every 20 ms): Python
    workers Spark reuses do not show up; a worker (or driver-side runner) it starts does."""
    before = _descendants()
    seen: dict[int, str] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            for pid, what in _descendants().items():
                # A process Spark spawns runs a helper first, then execs into Python.
                if pid not in before and (pid not in seen or what.startswith("pyspark.")):
                    seen[pid] = what

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()


class ServerCpu:
    """The CPU time of this process's child whose command line names ``name`` (moto's server),
    sampled from /proc every 20 ms on a thread: how busy the server was in a time window."""

    def __init__(self, name: str = "moto") -> None:
        self.pid = next(pid for pid in _descendants() if name in _cmdline(pid))
        self.samples: list[tuple[float, float]] = []
        self._done = threading.Event()
        self._tick = os.sysconf("SC_CLK_TCK")
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            try:
                with open(f"/proc/{self.pid}/stat", "rb") as f:
                    fields = f.read().decode().rsplit(")", 1)[1].split()
            except OSError:
                return  # the server has exited
            cpu = (int(fields[11]) + int(fields[12])) / self._tick  # utime + stime
            self.samples.append((time.monotonic(), cpu))

    def used(self, start: float, end: float) -> float:
        """CPU seconds between two ``time.monotonic()`` instants (to the nearest samples)."""
        inside = [cpu for t, cpu in self.samples if start <= t <= end]
        return inside[-1] - inside[0] if len(inside) > 1 else 0.0

    def stop(self) -> None:
        self._done.set()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def describe(procs: dict[int, str]) -> str:
    kinds: dict[str, int] = {}
    for what in procs.values():
        kinds[what] = kinds.get(what, 0) + 1
    return ", ".join(f"{n} x {what}" for what, n in sorted(kinds.items())) or "none"


def driver_calls(local: LocalAws, stream: str, repeat: int = 5) -> None:
    """The source's own driver work for one AvailableNow query, timed by calling its reader
    as Spark does (the executors' reads in between are not counted): median of ``repeat``."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from kclasync.spark.checks import check_source
    from kclasync.spark.shard_task import arrow_batches
    from kclasync.spark.source import KinesisStreamReader, SourceOptions

    options = SourceOptions.parse(
        {
            "streamName": stream,
            "endpointUrl": local.endpoint_url,
            "startingPosition": "TRIM_HORIZON",
            "maxRecordsPerShard": "100000",
            **AWS,
        }
    )
    check_source(options)  # what load() does: creates the progress table
    phases: dict[str, list[float]] = {}
    everything = ReadAllAvailable()

    def timed(name: str, call: Any) -> Any:
        started = time.monotonic()
        out = call()
        phases.setdefault(name, []).append(time.monotonic() - started)
        return out

    for _ in range(repeat):
        reader = KinesisStreamReader(options)
        first = timed("initialOffset (opens the clients)", reader.initialOffset)
        reader.prepareForTriggerAvailableNow()
        end = timed("latestOffset, the batch", partial(reader.latestOffset, first, everything))
        parts = timed("partitions", partial(reader.partitions, first, end))
        for part in parts:  # the executors' work, not timed
            for _batch in arrow_batches(part):
                pass
        last = timed("latestOffset, nothing more", partial(reader.latestOffset, end, everything))
        assert last == end, "the final planning found more to read"
        timed("stop", reader.stop)
    total = 0.0
    for name, seconds in phases.items():
        mid = statistics.median(seconds)
        total += mid
        print(f"  driver: {name:<36} {1000 * mid:7.0f} ms (median of {repeat})")
    print(f"  driver: {'total':<36} {1000 * total:7.0f} ms")
    # What Spark's per-query Python process for the source pays before the reader exists: a
    # fresh interpreter importing Spark's runner, then the source (botocore, aiohttp, kclasync).
    runner = "import pyspark.sql.streaming.python_streaming_source_runner"
    for label, code in (
        ("python + Spark's source runner", runner),
        ("  + import kclasync.spark.source", f"{runner}; import kclasync.spark.source"),
    ):
        took = []
        for _ in range(repeat):
            started = time.monotonic()
            subprocess.run([sys.executable, "-c", code], check=True)
            took.append(time.monotonic() - started)
        mid = statistics.median(took)
        print(f"  process: {label:<35} {1000 * mid:7.0f} ms (median of {repeat})")


def profile_task(local: LocalAws, stream: str) -> None:
    """One executor-side read of the first shard, under cProfile."""
    from kclasync.spark.fetch import read_shard
    from kclasync.spark.schema import records_to_arrow

    async def task() -> None:
        async with local.client_options().create_client("kinesis") as client:
            kinesis = KinesisStreamClient(client)
            shard = (await kinesis.list_shards(stream))[0].shard_id
            read = await read_shard(kinesis, stream, shard, "TRIM_HORIZON", quota=100_000)
            for i in range(0, len(read.records), 4096):
                records_to_arrow(read.records[i : i + 4096], stream)

    prof = cProfile.Profile()
    prof.enable()
    asyncio.run(task())
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
