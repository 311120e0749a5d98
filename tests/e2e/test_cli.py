"""The two commands a user runs: ``kclasync demo`` and ``kclasync leases``."""

from __future__ import annotations

import asyncio
import io
import re

import pytest

from kclasync._cli import main
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint
from kclasync._demo import DemoSettings, run_demo
from kclasync.testing.emulators import LocalAws
from tests.support import aws_for


def test_demo_accounts_for_every_record_through_a_crash() -> None:
    out = io.StringIO()
    # 6 s: the live view prints its first frame at 5 s.
    settings = DemoSettings(shards=2, workers=2, duration=6, rate=200, backlog=600, failover=1.0)
    assert asyncio.run(run_demo(settings, out)) == 0
    text = out.getvalue()
    produced = int(re.search(r"records produced\s+([\d,]+)", text)[1].replace(",", ""))  # type: ignore[index]
    consumed = int(re.search(r"records consumed\s+([\d,]+)", text)[1].replace(",", ""))  # type: ignore[index]
    assert produced >= 600 + 200 * 4
    assert consumed == produced
    assert re.search(r"\n  lost\s+0\n", text)
    assert "crashed holding" in text and "taken over after" in text
    assert "OK: every record was processed" in text
    # Each frame's worker lines count the leases the table beside them shows that worker owning.
    frames = [frame for frame in text.split("\nt=")[1:] if "owns " in frame]
    line = re.compile(r"\n  (worker-\d+)\s+running\s+owns (\d+) leases? in the table")
    checked = 0
    for frame in frames:
        for worker, owned in line.findall(frame):
            rows = re.findall(rf"\n  shardId-\S+\s+{worker}\s", frame)
            assert len(rows) == int(owned), frame
            checked += 1
    assert checked


def test_demo_rejects_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--shards", "0"])
    assert "--shards must be between 1 and 50" in capsys.readouterr().err


def test_leases_prints_the_table(
    moto: LocalAws,
    unique_name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def setup() -> None:
        async with aws_for(moto, unique_name) as aws:
            await aws.store.ensure_table()
            await aws.store.create_lease(
                Lease(key="shardId-1", owner="w1", checkpoint=Checkpoint("42"))
            )
            await aws.store.create_lease(Lease(key="shardId-2", sticky=10))
            await aws.dynamodb.put_item(TableName=aws.name, Item={"leaseKey": {"S": "broken"}})

    asyncio.run(setup())
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    code = main(
        ["leases", "-a", unique_name, "--endpoint-url", moto.endpoint_url, "--region", "us-east-1"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert re.search(r"shardId-1\s+w1\s+0\s+42\s", out)
    assert re.search(r"shardId-2\s+-\s+0\s+TRIM_HORIZON\s+10", out)
    assert "CORRUPT lease 'broken' is corrupt: attribute 'leaseCounter' is missing" in out
    assert "2 leases, 1 corrupt" in out
