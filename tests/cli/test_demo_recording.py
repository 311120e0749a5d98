"""``kclasync demo`` records its run in the dashboard's format and says how to replay it: the
crashed worker's leases appear taken after expiry, with a sample of every worker each second."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

from kclasync._demo import DemoSettings, run_demo
from kclasync._observations import EXPIRED, read_recording


def test_the_demo_records_the_crash_and_prints_the_replay_command(tmp_path: Path) -> None:
    path = tmp_path / "demo.jsonl"
    out = io.StringIO()
    # The demo's own failover time (3 s). The recording tells an expiry from a handoff by how
    # long the old owner was silent, in dashboard reads (one a second): at a 1 s failover a
    # take can be seen one read after the last renewal, which no reader can tell apart.
    settings = DemoSettings(
        shards=2, workers=2, duration=8, rate=100, backlog=300, failover=3.0, record=str(path)
    )
    assert asyncio.run(run_demo(settings, out)) == 0, out.getvalue()
    assert f"  kclasync dashboard --replay {path}\n" in out.getvalue()
    recording = read_recording(path)
    assert (recording.application, recording.source) == ("kclasync-demo", "demo")
    leases = [o for o in recording.observations if o["kind"] == "lease"]
    crashed = out.getvalue().split("*** ")[1].split(" crashed")[0]
    owner: dict[str, str | None] = {}
    expired = []
    for line in leases:
        if line["reason"] == EXPIRED:
            expired.append((line["lease"], owner[line["lease"]], line["owner"]))
        owner[line["lease"]] = line["owner"]
    # Every lease the crashed worker held at the end was taken by the other after expiry.
    assert expired and all(old == crashed and new != crashed for _, old, new in expired), leases
    assert crashed not in owner.values(), leases
    samples = [o for o in recording.observations if o["kind"] == "workers"]
    assert len(samples) >= 5
    assert {"worker-0", "worker-1"} <= set(samples[-1]["workers"])
    # Metrics were read (the crashed worker's stop with it, whichever worker that was).
    rates = [w["records_per_second"] for s in samples[2:] for w in s["workers"].values()]
    assert any(rate for rate in rates if rate is not None), samples
