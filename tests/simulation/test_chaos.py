"""Real worker processes against moto's server, with SIGKILL, SIGSTOP/SIGCONT and restarts.

A producer writes (one PutRecords request at a time: moto loses records under concurrent ones)
while three worker processes (``kclasync._simulation.chaos_worker``) share the stream; for a
bounded time a seeded chaos loop kills a worker (and starts a replacement), or stalls one for
longer than the failover time. Afterwards every produced record was processed, and every record
processed twice was processed by a worker that was killed or stalled.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from kclasync.testing.emulators import LocalAws
from tests.support import aws_for, wait_until

pytestmark = pytest.mark.asyncio

FAILOVER = 2.0
CHAOS_SECONDS = 18.0
SEED = 20240601


class Fleet:
    def __init__(self, moto: LocalAws, stream: str, out: Path) -> None:
        self.moto = moto
        self.stream = stream
        self.out = out
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started = 0
        self.victims: set[str] = set()
        self.stalled: set[str] = set()

    def start(self) -> str:
        worker_id = f"chaos-{self.started}"
        self.started += 1
        self.procs[worker_id] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kclasync._simulation.chaos_worker",
                "--endpoint-url",
                self.moto.endpoint_url,
                "--stream",
                self.stream,
                "--worker-id",
                worker_id,
                "--out",
                str(self.out / f"{worker_id}.log"),
                "--failover",
                str(FAILOVER),
            ],
            env={**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "x"},
        )
        return worker_id

    def running(self) -> list[str]:
        return [w for w, p in self.procs.items() if p.poll() is None and w not in self.stalled]

    def processed(self) -> dict[int, list[str]]:
        by_record: dict[int, list[str]] = defaultdict(list)
        for path in self.out.glob("*.log"):
            for line in path.read_bytes().splitlines():
                parts = line.split()
                if len(parts) == 4:
                    by_record[int(parts[0])].append(parts[3].decode())
        return by_record

    def stop_all(self) -> None:
        for worker_id, proc in self.procs.items():
            if proc.poll() is None:
                if worker_id in self.stalled:
                    proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _chaos(fleet: Fleet, rng: random.Random, until: float) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        await asyncio.sleep(rng.uniform(1.5, 3.0))
        candidates = fleet.running()
        if len(candidates) < 2:
            continue
        victim = rng.choice(sorted(candidates))
        fleet.victims.add(victim)
        if rng.random() < 0.5:
            fleet.procs[victim].send_signal(signal.SIGKILL)
            fleet.procs[victim].wait()
            await asyncio.sleep(0.5)
            fleet.start()
        else:
            fleet.stalled.add(victim)
            fleet.procs[victim].send_signal(signal.SIGSTOP)
            await asyncio.sleep(rng.uniform(1.5, 2.5) * FAILOVER)
            fleet.procs[victim].send_signal(signal.SIGCONT)
            fleet.stalled.discard(victim)


@pytest.mark.timeout(150)
async def test_processes_survive_kill_and_stop(
    moto: LocalAws, unique_name: str, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    fleet = Fleet(moto, unique_name, tmp_path)
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(4)
        produced: list[int] = []
        try:
            for _ in range(3):
                fleet.start()
            loop = asyncio.get_running_loop()
            until = loop.time() + CHAOS_SECONDS
            chaos = asyncio.create_task(_chaos(fleet, rng, until))
            while loop.time() < until:
                produced += await aws.produce(40)  # one PutRecords request at a time
                await asyncio.sleep(0.1)
            await chaos
            await wait_until(
                lambda: set(produced) <= fleet.processed().keys(), 60, "every record processed"
            )
        finally:
            fleet.stop_all()
    processed = fleet.processed()
    assert fleet.victims, "the chaos loop never struck"
    assert set(produced) <= processed.keys()
    duplicated = {rid: workers for rid, workers in processed.items() if len(workers) > 1}
    innocent = {rid: w for rid, w in duplicated.items() if not fleet.victims & set(w)}
    assert not innocent, f"records processed twice without a crash or stall: {innocent}"
