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
import pytest

from kclasync.testing.emulators import LocalAws, free_port
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
        "KCLASYNC_FAILOVER": "3",
        "KCLASYNC_STREAM_WAIT": "60",
    }


@contextlib.contextmanager
def processes(logs: pathlib.Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.terminate()
        for proc in started:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def spawn(
    procs: list[subprocess.Popen[bytes]], args: list[str], env: dict[str, str], log: pathlib.Path
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    procs.append(proc)
    return proc


@contextlib.asynccontextmanager
async def prometheus_api(config: pathlib.Path, data: pathlib.Path) -> AsyncIterator[Any]:
    port = free_port()
    assert PROMETHEUS is not None
    with (data / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={data / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
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
    finally:
        proc.terminate()
        proc.wait(15)


async def test_prometheus_scrapes_lease_counts(
    moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    env = stack_env(moto, unique_name)
    ports = {worker: free_port() for worker in WORKERS}
    config = tmp_path / "prometheus.yml"
    targets = ", ".join(f"'127.0.0.1:{port}'" for port in ports.values())
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        f"scrape_configs:\n  - job_name: kclasync\n    static_configs:\n      - targets: [{targets}]\n"
    )
    check = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True)
    assert check.returncode == 0, check.stderr.decode()

    with processes(tmp_path) as procs:
        producer = spawn(
            procs,
            [sys.executable, "deploy/producer.py"],
            {**env, "KCLASYNC_RATE": "200", "KCLASYNC_PRODUCE_SECONDS": "4"},
            tmp_path / "producer.log",
        )
        for worker, port in ports.items():
            worker_env = {**env, "KCLASYNC_WORKER_ID": worker, "KCLASYNC_METRICS_PORT": str(port)}
            spawn(
                procs, [sys.executable, "deploy/worker.py"], worker_env, tmp_path / f"{worker}.log"
            )
        async with prometheus_api(config, tmp_path) as query:
            counts: dict[str, float] = {}

            async def balanced() -> bool:
                nonlocal counts
                rows = await query(LEASES_PER_WORKER % unique_name)
                counts = {row["metric"]["worker"]: float(row["value"][1]) for row in rows}
                return counts == {worker: SHARDS / len(WORKERS) for worker in WORKERS}

            try:
                await wait_until(balanced, 45, "two leases per worker in Prometheus")
            except AssertionError:
                logs = {p.name: p.read_text()[-2000:] for p in tmp_path.glob("*.log")}
                raise AssertionError(f"last result {counts}; logs {logs}") from None
            print(f"{LEASES_PER_WORKER % unique_name} -> {counts}")

            assert await asyncio.to_thread(producer.wait, 30) == 0
            produced = int((tmp_path / "producer.log").read_text().split()[-2])
            assert produced > 0
            processed = 0.0

            async def all_processed() -> bool:
                nonlocal processed
                rows = await query(RECORDS % unique_name)
                processed = float(rows[0]["value"][1]) if rows else 0.0
                return processed >= produced

            await wait_until(all_processed, 30, f"{produced} records counted in Prometheus")
            print(f"{RECORDS % unique_name} -> {processed:.0f} (produced {produced})")
