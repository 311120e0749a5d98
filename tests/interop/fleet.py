"""What the interop scenarios share: kclasync workers in their own processes, producing records
that carry (key, counter), the deliveries both implementations recorded, and a watch on the
lease table and the leader lock.

Owns: starting and killing kclasync worker processes (``kclasync_worker.py``), reading the
delivery files (one line per record: shard, key, counter, sequence number, epoch seconds),
counting lost and reprocessed records against the checkpoints, and sampling lease owners and
the lock holder once a second. Nothing here decides whether a scenario passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import orjson

from kclasync._adapters.coordinator_state import DynamoCoordinatorState, coordinator_table_name
from kclasync.testing.emulators import LocalAws
from tests.support import Aws

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "kclasync_worker.py"
KEYS = 53

#: How often a kclasync leader assigns leases (``assignment_interval``).
ASSIGNMENT_INTERVAL = 2.0
#: How often a Java leader does (leaseAssignmentIntervalMillis in ``java_kcl.FAST_PROPERTIES``):
#: its first run finds no worker metrics of a daemon just started, which reads only after the
#: second; at 1 s instead of 2 s a daemon leading alone read its first record 1 s sooner
#: (8.1 -> 7.1 s, measured twice each, alternated).
JAVA_ASSIGNMENT_INTERVAL = 1.0

#: kclasync's settings in the scenarios: the Java side's shortened timings
#: (``java_kcl.FAST_PROPERTIES``) and the KCL 3.x-compatible leader-based mode.
KCLASYNC_CONFIG: Mapping[str, Any] = {
    "lease_taker": "kcl3",
    "failover_time": 3.0,
    "assignment_interval": ASSIGNMENT_INTERVAL,
    "initial_position": "TRIM_HORIZON",
    "idle_time_between_reads": 0.2,
    "shard_sync_interval": 5.0,
    "parent_shard_poll_interval": 0.5,
    "leader_lock_duration": 6.0,
    "leader_heartbeat_interval": 1.0,
    "shutdown_timeout": 10.0,
}

Rid = tuple[str, int]


@attrs.frozen
class Delivery:
    who: str
    shard: str
    rid: Rid
    seq: int
    at: float


def stop_process_group(proc: subprocess.Popen[bytes], *, kill: bool, grace: float) -> int:
    """SIGTERM (a graceful stop) or SIGKILL to the process group of ``proc``, SIGKILL after
    ``grace`` seconds anyway, then SIGKILL to whatever of the group is left (children)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode


def read_deliveries(path: pathlib.Path, who: str) -> list[Delivery]:
    out: list[Delivery] = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 5:
                continue  # a line being written right now
            shard, key, counter, seq, at = parts
            out.append(Delivery(who, shard, (key, int(counter)), int(seq), float(at)))
    return out


async def produce(aws: Aws, first: int, count: int) -> set[Rid]:
    """Put records ``first .. first+count-1``, each carrying its partition key and counter."""
    sent = [(f"key-{i % KEYS}", i) for i in range(first, first + count)]
    pending = [(k, orjson.dumps({"k": k, "c": i})) for k, i in sent]
    while pending:
        chunk, pending = pending[:500], pending[500:]
        results = await aws.stream.put_records(aws.name, chunk)
        pending = [e for e, r in zip(chunk, results, strict=True) if r is None] + pending
    return set(sent)


class Producer:
    """Records at a steady rate in the background, counters from ``first`` on."""

    def __init__(self, aws: Aws, first: int, per_second: int) -> None:
        self.aws, self.next, self.rate = aws, first, per_second
        self.sent: set[Rid] = set()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        # Small steps: each lease's per-second throughput (what a KCL 3.x leader balances on)
        # then varies little from one renewal period to the next.
        step = max(1, self.rate // 10)
        while True:
            started = time.monotonic()
            self.sent |= await produce(self.aws, self.next, step)
            self.next += step
            await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - started)))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> set[Rid]:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.sent


class KclasyncProcess:
    """One kclasync worker process."""

    def __init__(
        self,
        local: LocalAws,
        *,
        stream: str,
        application: str,
        worker_id: str,
        workdir: pathlib.Path,
        **config: Any,
    ) -> None:
        self.worker_id = worker_id
        self.out_file = workdir / f"{worker_id}.records"
        self.log_file = workdir / f"{worker_id}.log"
        self.spec_file = workdir / f"{worker_id}.json"
        spec = {
            "endpoint": local.endpoint_url,
            "kinesis_endpoint": local.kinesis_endpoint_url,
            "stream": stream,
            "application": application,
            "out": str(self.out_file),
            "config": {**KCLASYNC_CONFIG, "worker_id": worker_id, **config},
        }
        self.spec_file.write_text(json.dumps(spec))
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, *, held: bool = False) -> KclasyncProcess:
        """Start the process. ``held``: it imports everything, then waits for ``release()``
        before its worker starts, so that a handover does not wait for Python's start-up."""
        self.out_file.touch()
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, str(WORKER), str(self.spec_file), *(["--held"] if held else [])],
                stdin=subprocess.PIPE if held else subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(HERE.parent.parent)},
                start_new_session=True,
            )
        return self

    def release(self) -> KclasyncProcess:
        """Let a process started ``held`` start its worker."""
        assert self._proc is not None and self._proc.stdin is not None, "not started held"
        assert self._proc.poll() is None, "the held worker exited:\n" + self.log()[-3000:]
        self._proc.stdin.write(b"go\n")
        self._proc.stdin.close()
        return self

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, *, kill: bool = False, grace: float = 30.0) -> int | None:
        proc, self._proc = self._proc, None
        return None if proc is None else stop_process_group(proc, kill=kill, grace=grace)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def deliveries(self) -> list[Delivery]:
        return read_deliveries(self.out_file, self.worker_id)


def delivered(deliveries: Iterable[Delivery]) -> set[Rid]:
    return {d.rid for d in deliveries}


def beyond_checkpoints(deliveries: Iterable[Delivery], checkpoints: Mapping[str, str]) -> set[Rid]:
    """Records delivered after the checkpoint of their shard (may legitimately be redone)."""
    out = set()
    for d in deliveries:
        cp = checkpoints.get(d.shard, "TRIM_HORIZON")
        if not cp.isdigit() or d.seq > int(cp):
            out.add(d.rid)
    return out


async def checkpoints(aws: Aws) -> dict[str, str]:
    scan = await aws.store.list_leases()
    assert not scan.corrupt, scan.corrupt
    return {lease.shard_id: lease.checkpoint.value for lease in scan.leases}


@attrs.frozen
class Sample:
    at: float
    owners: Mapping[str, str | None]
    leader: str | None
    version: str | None


class Watch:
    """Samples lease owners and the lock holder every ``period`` seconds; also asserts that
    the lease table holds nothing but leases (every item has a ``leaseCounter``)."""

    def __init__(self, aws: Aws, period: float = 1.0) -> None:
        self.aws, self.period = aws, period
        self.locks = DynamoCoordinatorState(aws.dynamodb, coordinator_table_name(aws.name))
        self.samples: list[Sample] = []
        self.not_leases: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None

    async def sample(self) -> Sample:
        raw = await self.aws.dynamodb.scan(TableName=self.aws.name, ConsistentRead=True)
        self.not_leases += [item for item in raw["Items"] if "leaseCounter" not in item]
        # Leases of shards still being read; a finished lease (SHARD_END) is not processed
        # by anyone, so where a leader puts it before it is deleted reads nothing twice.
        owners = {
            item["leaseKey"]["S"]: item.get("leaseOwner", {}).get("S")
            for item in raw["Items"]
            if item.get("checkpoint", {}).get("S") != "SHARD_END"
        }
        lock = await self.locks.get_lock("Leader")
        sample = Sample(
            time.time(),
            owners,
            None if lock is None else lock.owner,
            None if lock is None else lock.record_version,
        )
        self.samples.append(sample)
        return sample

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.sample()
            await asyncio.sleep(self.period)

    def start(self) -> Watch:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def leader_since(self, owner: str) -> float | None:
        """When the lock was first seen held by ``owner``."""
        return next((s.at for s in self.samples if s.leader == owner), None)

    def last_version_change(self, *owners: str) -> float | None:
        """When a new record version of a lock held by one of ``owners`` was last seen."""
        last, seen = None, None
        for s in self.samples:
            if s.leader in owners and s.version != seen:
                last, seen = s.at, s.version
        return last

    def owner_changes(self, since: float, until: float) -> dict[str, list[str]]:
        """Each lease's successive owners (unowned moments left out) within the window."""
        out: dict[str, list[str]] = {}
        for s in self.samples:
            if since <= s.at <= until:
                for key, owner in s.owners.items():
                    seq = out.setdefault(key, [])
                    if owner is not None and (not seq or seq[-1] != owner):
                        seq.append(owner)
        return out


def ping_pong(changes: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """Leases that went back to an owner they had left."""
    return {k: v for k, v in changes.items() if len(set(v)) < len(v)}


def owner_change_times(samples: Iterable[Sample]) -> dict[str, list[float]]:
    """Per lease, when the watch saw its owner change (a handoff that began just before a
    window still explains the switch just after its start)."""
    out: dict[str, list[float]] = {}
    last: dict[str, str | None] = {}
    for s in samples:
        for key, owner in s.owners.items():
            if key in last and owner != last[key]:
                out.setdefault(key, []).append(s.at)
            last[key] = owner
    return out


def unexplained_switches(
    deliveries: Iterable[Delivery],
    changes: Mapping[str, list[float]],
    since: float,
    until: float,
    window: float,
) -> dict[str, list[float]]:
    """Moments a shard's records went from one implementation to the other without an owner
    change of its lease that the old side followed within ``window`` seconds (its last record
    before the switch no later than ``window`` after the change, the change no later than
    ``window`` after the new side's first record): both processing the shard."""
    by_shard: dict[str, list[Delivery]] = {}
    for d in deliveries:
        by_shard.setdefault(d.shard, []).append(d)
    out: dict[str, list[float]] = {}
    for shard, ds in by_shard.items():
        ds.sort(key=lambda d: d.at)
        for a, b in itertools.pairwise(ds):
            switched = a.who.startswith("java") != b.who.startswith("java")
            near = any(a.at <= c + window and c <= b.at + window for c in changes.get(shard, []))
            if switched and since <= b.at <= until and not near:
                out.setdefault(shard, []).append(b.at)
    return out


def children_after_parents(
    deliveries: Iterable[Delivery], lineage: Mapping[str, Iterable[str]]
) -> list[str]:
    """Child shards with a record delivered before the last record of one of its parents."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for d in deliveries:
        first[d.shard] = min(first.get(d.shard, d.at), d.at)
        last[d.shard] = max(last.get(d.shard, d.at), d.at)
    return [
        f"{child} read at {first[child]:.3f} before {parent} finished at {last[parent]:.3f}"
        for child, parents in lineage.items()
        for parent in parents
        if child in first and parent in last and first[child] < last[parent]
    ]


async def reshard(aws: Aws) -> dict[str, list[str]]:
    """Split the stream's first shard in the middle and merge its last two: child -> parents.
    The stream must have had four shards and no resharding yet."""
    client = aws.stream._client
    shards = {s.shard_id: s for s in await aws.stream.list_shards(aws.name)}
    first, third, fourth = sorted(shards)[0], sorted(shards)[2], sorted(shards)[3]
    rng = shards[first].hash_range
    await client.split_shard(
        StreamName=aws.name,
        ShardToSplit=first,
        NewStartingHashKey=str((rng.start + rng.end) // 2 + 1),
    )
    await _active(aws)
    await client.merge_shards(StreamName=aws.name, ShardToMerge=third, AdjacentShardToMerge=fourth)
    await _active(aws)
    lineage: dict[str, list[str]] = {}
    for s in await aws.stream.list_shards(aws.name):
        parents = [p for p in (s.parent_shard_id, s.adjacent_parent_shard_id) if p]
        if s.shard_id not in shards and parents:
            lineage[s.shard_id] = parents
    return lineage


async def _active(aws: Aws) -> None:
    for _ in range(200):
        resp = await aws.stream._client.describe_stream_summary(StreamName=aws.name)
        if resp["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{aws.name} did not become ACTIVE after resharding")
