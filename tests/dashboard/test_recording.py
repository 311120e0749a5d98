"""``kclasync dashboard --record`` and ``--replay``, run as a user runs them (the command in a
subprocess, moto over HTTP on 127.0.0.1), and ``kclasync simulate --record`` read back by the
same replay."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kclasync._cli import main
from kclasync._observations import read_recording
from kclasync.testing.emulators import LocalAws
from tests.dashboard.serving import seed_table
from tests.support import wait_until

ENV = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@asynccontextmanager
async def dashboard_command(*args: str) -> AsyncIterator[tuple[str, list[str]]]:
    """``kclasync dashboard ARGS --port 0``: its URL and the lines it printed first."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kclasync._cli", "dashboard", *args, "--port", "0",
        stdout=subprocess.PIPE, env=ENV,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        lines = [first]
        if "--record" in args:
            lines.append((await asyncio.wait_for(proc.stdout.readline(), 30)).decode())
        yield first.rsplit(": ", 1)[1].strip(), lines
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def lines_of(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


async def get_json(url: str) -> Any:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200
        return await resp.json()


async def test_record_with_no_page_open_then_replay(
    moto: LocalAws, unique_name: str, tmp_path: Path
) -> None:
    path = tmp_path / "fleet.jsonl"
    async with moto.client_options().create_client("dynamodb") as client:
        store = await seed_table(client, unique_name)
        where = ("--endpoint-url", moto.endpoint_url, "--region", "us-east-1")
        args = ("-a", unique_name, *where, "--interval", "0.2", "--record", str(path))
        async with dashboard_command(*args) as (_, printed):
            assert printed[1] == f"recording to {path}\n"

            async def sampled() -> bool:  # no page is open: it reads on regardless
                return sum(line["kind"] == "workers" for line in lines_of(path)) >= 3

            await wait_until(sampled, 30, "three samples written with no page open")
            lease = await store.get_lease("shardId-000000000001")
            assert await store.take_lease(lease, "w-b") is not None

            async def moved() -> bool:
                return any(
                    line["kind"] == "lease"
                    and line["owner"] == "w-b"
                    and line["reason"] != "first seen"
                    for line in lines_of(path)
                )

            await wait_until(moved, 30, "the take written to the recording")
    recording = read_recording(path)
    assert (recording.application, recording.source) == (unique_name, "dashboard")

    async with dashboard_command("--replay", str(path)) as (url, printed):
        assert printed[0].startswith(f"kclasync dashboard replay of {path}: http://127.0.0.1:")
        snap = await get_json(url + "snapshot.json")
        owners = {lease["key"]: lease["owner"] for lease in snap["leases"]}
        assert owners == {
            "shardId-000000000000": "w-a",
            "shardId-000000000001": "w-b",
            "shardId-000000000002": "w-b",
        }
        assert snap["replay"]["source"] == "dashboard" and snap["at"] == recording.end
        history = await get_json(url + "history.json")
        ring = history["timeline"]["shardId-000000000001"]
        assert [segment["owner"] for segment in ring] == ["w-a", "w-b"]
        assert ring[0]["end"] == ring[1]["start"] and ring[1]["end"] is None
        assert len(history["samples"]) == sum(
            o["kind"] == "workers" for o in recording.observations
        )


def test_replay_of_a_bad_file_and_a_missing_application(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "lease"}\n')
    assert main(["dashboard", "--replay", str(bad), "--port", "0"]) == 1
    assert capsys.readouterr().err == (
        f"kclasync dashboard: error: {bad} line 1: not a kclasync recording (its first line "
        'must be {"kind": "header", "format": "kclasync-observations", ...})\n'
    )
    assert main(["dashboard", "--replay", str(tmp_path / "none.jsonl"), "--port", "0"]) == 1
    assert "No such file or directory" in capsys.readouterr().err
    assert main(["dashboard"]) == 2
    assert capsys.readouterr().err == (
        "kclasync dashboard: error: --application is required (or --replay FILE)\n"
    )


def test_simulate_records_what_the_dashboard_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A simulated fleet with crashes, in virtual time: the recording has a sample every five
    virtual seconds and every lease's owners, crashes included, in the dashboard's format."""
    path = tmp_path / "sim.jsonl"
    args = ["simulate", "--workers", "4", "--shards", "8", "--hours", "0.1", "--seed", "0"]
    assert main([*args, "--faults", "crash", "--fault-rate", "4", "--record", str(path)]) == 0
    assert f"kclasync dashboard --replay {path}" in capsys.readouterr().err
    recording = read_recording(path)
    assert (recording.application, recording.source) == ("sim", "simulation")
    assert recording.start is not None and recording.end is not None
    span = recording.end - recording.start
    assert 0.1 * 3600 <= span <= 0.1 * 3600 + 600  # the faults' time, then the settling
    samples = [o for o in recording.observations if o["kind"] == "workers"]
    assert len(samples) >= 0.1 * 3600 / 5
    leases = [o for o in recording.observations if o["kind"] == "lease"]
    assert {o["lease"] for o in leases} >= {f"shardId-{i:012d}" for i in range(8)}
    assert any(o["reason"] == "taken after expiry" for o in leases), leases
    assert max(sum(w["leases"] for w in s["workers"].values()) for s in samples) == 8
    assert main([*args, "--seeds", "2", "--record", str(path)]) == 2
