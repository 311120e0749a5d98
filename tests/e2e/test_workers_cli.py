"""``kclasync workers``: each worker's metrics, assigned throughput and lease count, on moto."""

from __future__ import annotations

import asyncio
import re

import pytest

from kclasync._adapters.worker_metrics_table import DynamoWorkerMetrics
from kclasync._adapters.worker_registry import worker_metrics_table_name
from kclasync._cli import main
from kclasync._core.leases.lease import Lease
from kclasync._core.workers.worker_metrics import WorkerMetrics
from kclasync.testing.emulators import LocalAws
from tests.support import aws_for


def test_workers_prints_metrics_throughput_and_counts(
    moto: LocalAws,
    unique_name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def setup() -> None:
        async with aws_for(moto, unique_name) as aws:
            await aws.store.ensure_table()
            for i, (owner, kbps) in enumerate([("w1", 100.0), ("w1", 20.5), ("w2", 7.0)]):
                await aws.store.create_lease(
                    Lease(key=f"shardId-{i}", owner=owner, throughput_kbps=kbps)
                )
            await aws.store.create_lease(Lease(key="shardId-9"))
            registry = DynamoWorkerMetrics(aws.dynamodb, worker_metrics_table_name(aws.name))
            await registry.ensure_table()
            await registry.report(
                WorkerMetrics(
                    worker_id="w2",
                    last_update=1700000000,
                    metric_stats={"C": (10.0, 55.5)},
                    operating_range={"C": (80,)},
                    capacity_kbps=2500.0,
                )
            )

    asyncio.run(setup())
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    args = ["workers", "-a", unique_name, "--endpoint-url", moto.endpoint_url]
    code = main([*args, "--region", "us-east-1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert re.search(r"w1\s+2\s+120\.5\s+-\s+-\s+-", out), out
    assert re.search(r"w2\s+1\s+7\.0\s+55\.5/80\s+2500\.0\s+1700000000", out), out
    assert "2 workers, 3 leases owned, 1 unowned" in out
