"""A real Prometheus scraping the stack's workers (deploy/worker.py, three processes) and the
stack's producer (deploy/producer.py) on moto; PromQL through Prometheus' HTTP API."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import attrs
import pytest

from kclasync.testing.emulators import LocalAws, free_port
from tests.deploy.test_config import grafana_queries
from tests.support import wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="Debian's prometheus is not installed (.ci/run installs it: apt-get install prometheus)",
)

SHARDS = 6
WORKERS = ("worker-1", "worker-2", "worker-3")
LEASES_PER_WORKER = 'sum by (worker) (kclasync_leases_held{application="%s"})'
RECORDS = 'sum(kclasync_records_processed_total{application="%s"})'


def stack_env(moto: LocalAws, app: str) -> dict[str, str]:
    return {
        **os.environ,
        "AWS_ENDPOINT_URL": moto.endpoint_url,
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "KCLASYNC_STREAM": app,
        "KCLASYNC_APPLICATION": app,
        "KCLASYNC_SHARDS": str(SHARDS),
        "KCLASYNC_METRICS_HOST": "127.0.0.1",
        "KCLASYNC_FAILOVER": "2",
        "KCLASYNC_STREAM_WAIT": "60",
    }


@attrs.frozen
class Stack:
    prometheus: str
    producer: subprocess.Popen[bytes]
    logs: pathlib.Path


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def stack(moto: LocalAws, unique_name: str, tmp_path: pathlib.Path) -> Iterator[Stack]:
    """The producer, three workers and Prometheus scraping them (test-only scrape config)."""
    env = stack_env(moto, unique_name)
    ports = {worker: free_port() for worker in WORKERS}
    config = tmp_path / "prometheus.yml"
    targets = ", ".join(f"'127.0.0.1:{port}'" for port in ports.values())
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: kclasync\n    static_configs:\n"
        f"      - targets: [{targets}]\n"
    )
    check = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True)
    assert check.returncode == 0, check.stderr.decode()

    procs: list[subprocess.Popen[bytes]] = []

    def spawn(args: list[str], extra: dict[str, str], log: str) -> subprocess.Popen[bytes]:
        with (tmp_path / log).open("wb") as out:
            proc = subprocess.Popen(
                args, env={**env, **extra}, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
            )
        procs.append(proc)
        return proc

    try:
        producer = spawn(
            [sys.executable, "deploy/producer.py"],
            {"KCLASYNC_RATE": "200", "KCLASYNC_PRODUCE_SECONDS": "4"},
            "producer.log",
        )
        for worker, port in ports.items():
            extra = {"KCLASYNC_WORKER_ID": worker, "KCLASYNC_METRICS_PORT": str(port)}
            spawn([sys.executable, "deploy/worker.py"], extra, f"{worker}.log")
        port = free_port()
        assert PROMETHEUS is not None
        spawn(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            {},
            "prometheus.log",
        )
        yield Stack(f"http://127.0.0.1:{port}", producer, tmp_path)
    finally:
        stop_all(procs)


@contextlib.asynccontextmanager
async def prometheus_api(base: str) -> AsyncIterator[Any]:
    async with aiohttp.ClientSession() as http:

        async def query(expr: str) -> list[dict[str, Any]]:
            async with http.get(base + "/api/v1/query", params={"query": expr}) as resp:
                body = await resp.json()
            assert body["status"] == "success", body
            result: list[dict[str, Any]] = body["data"]["result"]
            return result

        async def ready() -> bool:
            try:
                async with http.get(base + "/-/ready") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(ready, 30, "Prometheus ready")
        yield query


def read_logs(logs: pathlib.Path) -> dict[str, str]:
    return {p.name: p.read_text()[-2000:] for p in logs.glob("*.log")}


async def test_prometheus_scrapes_lease_counts(stack: Stack, unique_name: str) -> None:
    async with prometheus_api(stack.prometheus) as query:
        counts: dict[str, float] = {}

        async def balanced() -> bool:
            nonlocal counts
            rows = await query(LEASES_PER_WORKER % unique_name)
            counts = {row["metric"]["worker"]: float(row["value"][1]) for row in rows}
            return counts == {worker: SHARDS / len(WORKERS) for worker in WORKERS}

        try:
            took = await wait_until(balanced, 45, "two leases per worker in Prometheus")
        except AssertionError:
            logs = await asyncio.to_thread(read_logs, stack.logs)
            raise AssertionError(f"last result {counts}; logs {logs}") from None
        print(f"{LEASES_PER_WORKER % unique_name} -> {counts} after {took:.1f}s")

        # Every Grafana panel query is valid PromQL for a real Prometheus, and the leases
        # panel shows the same counts.
        for title, expr in grafana_queries():
            if expr.startswith("label_values("):
                continue  # a Grafana variable function, not PromQL
            rows = await query(expr.replace("$application", unique_name))
            if title == "Leases per worker":
                assert {r["metric"]["worker"]: float(r["value"][1]) for r in rows} == counts

        assert await asyncio.to_thread(stack.producer.wait, 30) == 0
        log = await asyncio.to_thread((stack.logs / "producer.log").read_text)
        produced = int(log.split()[-2])
        assert produced > 0
        processed = 0.0

        async def all_processed() -> bool:
            nonlocal processed
            rows = await query(RECORDS % unique_name)
            processed = float(rows[0]["value"][1]) if rows else 0.0
            return processed >= produced

        await wait_until(all_processed, 30, f"{produced} records counted in Prometheus")
        print(f"{RECORDS % unique_name} -> {processed:.0f} (produced {produced})")
