"""The worker processes of the chaos soak (``benchmarks/chaos_soak.py``): starting, signalling and
sampling them, and reading what they processed.

Each worker is ``python -m kclasync._simulation.chaos_worker`` (the chaos test's worker), which
appends ``<record id> <shard> <sequence> <worker id>`` per record to its file before the batch is
checkpointed, so a SIGKILL leaves whole lines; SIGTERM stops it gracefully. With
``--log-warnings`` its lost-lease lines go to stderr, which the soak reads to attribute
duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import attrs

from kclasync.testing.emulators import LocalAws
from kclasync.testing.fault_proxy import FaultPlan, FaultProxy
from kclasync.testing.service_limits import ServiceLimits

ROOT = Path(__file__).resolve().parent.parent
_LOST = re.compile(r"worker (\S+) lost lease (\S+?):")
WARMUP = 15.0  # seconds after a process's first delivery before its first resource sample


@attrs.frozen
class Sample:
    at: float  # seconds since the soak started
    rss_mib: float
    fds: int


@attrs.define
class Worker:
    worker_id: str
    proc: subprocess.Popen[bytes]
    started: float
    long_lived: bool
    samples: list[Sample] = attrs.field(factory=list)
    first_delivery: float | None = None
    fate: str = "running"  # running, killed, stopped


def sample(pid: int, at: float) -> Sample | None:
    """RSS and open descriptors of a process from /proc; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return Sample(at, int(line.split()[1]) / 1024, fds)
    return None  # a zombie has no VmRSS


class Deliveries:
    """Reads the workers' output files incrementally."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._offsets: dict[Path, int] = {}
        self.ids: set[int] = set()
        self.by_record: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.count = 0

    def poll(self) -> None:
        for path in sorted(self.out.glob("*.log")):
            with path.open("rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1  # only whole lines; a partial one is read next time
            self._offsets[path] = self._offsets.get(path, 0) + end
            for line in data[:end].splitlines():
                rid, shard, seq, worker = line.decode().split()
                self.ids.add(int(rid))
                self.by_record[(shard, seq)].append(worker)
                self.count += 1


class Fleet:
    """The worker processes, what was done to them, and their resource samples."""

    def __init__(self, aws: LocalAws, stream: str, out: Path, failover: float, t0: float) -> None:
        self.aws = aws
        self.stream = stream
        self.out = out
        self.failover = failover
        self.t0 = t0
        self.workers: dict[str, Worker] = {}
        self.started = 0
        self.killed: set[str] = set()
        self.stalled: set[str] = set()  # ever stalled
        self.stalled_now: set[str] = set()
        self.stopped: set[str] = set()
        #: (seconds since start, worker id, what happened)
        self.events: list[tuple[float, str, str]] = []

    def event(self, worker_id: str, what: str) -> None:
        self.events.append((round(self.now(), 1), worker_id, what))

    def now(self) -> float:
        return time.monotonic() - self.t0

    def start(self, long_lived: bool = False) -> str:
        worker_id = f"soak-{self.started}"
        self.started += 1
        cmd = [
            sys.executable,
            "-m",
            "kclasync._simulation.chaos_worker",
            "--log-warnings",
            "--endpoint-url",
            self.aws.endpoint_url,
            "--stream",
            self.stream,
            "--worker-id",
            worker_id,
            "--out",
            str(self.out / f"{worker_id}.log"),
            "--failover",
            str(self.failover),
        ]
        if self.aws.kinesis_endpoint_url:
            cmd += ["--kinesis-endpoint-url", self.aws.kinesis_endpoint_url]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "x"}
        log = (self.out / f"{worker_id}.stderr").open("wb")
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        log.close()
        self.workers[worker_id] = Worker(worker_id, proc, self.now(), long_lived)
        self.event(worker_id, "started")
        return worker_id

    def alive(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.proc.poll() is None]

    def note_deliveries(self) -> None:
        """Marks the workers whose output file has its first line."""
        for w in self.alive():
            if w.first_delivery is None:
                with contextlib.suppress(FileNotFoundError):
                    if (self.out / f"{w.worker_id}.log").stat().st_size:
                        w.first_delivery = self.now()

    def sample_all(self) -> None:
        self.note_deliveries()
        for w in self.alive():
            if w.first_delivery is not None and self.now() - w.first_delivery >= WARMUP:
                s = sample(w.proc.pid, self.now())
                if s is not None:
                    w.samples.append(s)

    def lost_leases(self) -> set[tuple[str, str]]:
        """(worker id, lease key) for every lease a worker logged as lost: not renewed in time
        although nothing was done to it (e.g. starved of CPU on a loaded machine)."""
        lost: set[tuple[str, str]] = set()
        for w in self.workers.values():
            path = self.out / f"{w.worker_id}.stderr"
            if path.exists():
                for line in path.read_text(errors="replace").splitlines():
                    match = _LOST.search(line)
                    if match:
                        lost.add((match[1], match[2]))
        return lost

    async def _wait_exit(self, w: Worker, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while w.proc.poll() is None:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def kill(self, w: Worker) -> None:
        self.event(w.worker_id, "SIGKILL")
        w.proc.send_signal(signal.SIGKILL)
        await self._wait_exit(w, 10)
        w.fate = "killed"
        self.killed.add(w.worker_id)

    async def stall(self, w: Worker, seconds: float) -> None:
        self.stalled.add(w.worker_id)
        self.stalled_now.add(w.worker_id)
        self.event(w.worker_id, f"SIGSTOP for {seconds:.1f}s")
        w.proc.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            w.proc.send_signal(signal.SIGCONT)
            self.stalled_now.discard(w.worker_id)

    async def stop(self, w: Worker) -> None:
        """Graceful stop; a worker that does not exit in time is killed and counted as such."""
        w.proc.send_signal(signal.SIGTERM)
        self.event(w.worker_id, "SIGTERM")
        if await self._wait_exit(w, 20):
            self.event(w.worker_id, f"exited {w.proc.returncode}")
            w.fate = "stopped"
            self.stopped.add(w.worker_id)
        else:
            await self.kill(w)

    async def shutdown(self) -> None:
        for w in self.alive():
            w.proc.send_signal(signal.SIGCONT)
            w.proc.send_signal(signal.SIGTERM)
        for w in list(self.workers.values()):
            if not await self._wait_exit(w, 20):
                w.proc.kill()
                w.proc.wait()


@contextlib.asynccontextmanager
async def fault_front(
    aws: LocalAws, faults: float, latency: float, limits: bool, seed: int
) -> AsyncIterator[tuple[LocalAws, FaultProxy | None]]:
    """The emulators as the workers reach them: through the fault proxy (``faults``: the share
    of requests, on both services, that meet a breaking fault; ``latency``: the share delayed
    by 0-2 s; ``limits``: the Kinesis limits enforced), or directly when none is asked for."""
    if not (faults or latency or limits):
        yield aws, None
        return
    upstreams = {
        "dynamodb": aws.endpoint_url,
        "kinesis": aws.kinesis_endpoint_url or aws.endpoint_url,
    }
    plan = FaultPlan.mixed(faults, latency=latency) if faults or latency else FaultPlan()
    proxy = FaultProxy(upstreams, plan=plan, seed=seed, limits=ServiceLimits() if limits else None)
    async with proxy as url:
        yield LocalAws(url), proxy
