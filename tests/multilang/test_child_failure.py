"""A child that dies mid-batch, end to end: as the Java daemon (``System.exit(1)``, whose
shutdown hook stops the scheduler gracefully), the worker logs it, stops gracefully (the other
shard's child gets ``shutdownRequested`` then ``leaseLost``) and exits with status 1; the dead
child's shard keeps its checkpoint, so its next owner reprocesses the batch."""

from __future__ import annotations

import pathlib
import re
import sys

import pytest

from kclasync.testing.emulators import LocalAws
from tests.interop.fleet import checkpoints, delivered, produce
from tests.multilang.test_kclpy_end_to_end import worker
from tests.support import aws_for, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

CRASHING = pathlib.Path(__file__).resolve().parent / "crashing_processor.py"


async def test_a_child_that_dies_stops_the_worker_as_the_daemon_does(
    kinesis: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    async with aws_for(kinesis, unique_name) as aws:
        await aws.create_stream(2)
        sent = await produce(aws, 0, 200)
        w = worker(
            kinesis, tmp_path, unique_name, "ml-c", executableName=f"{sys.executable} {CRASHING}"
        )
        w.start({"KCL_POISON": "0"})  # the first record of its shard
        try:
            await wait_until(lambda: w.wait_exit() is not None, 60, "the worker to exit")
            assert w.wait_exit() == 1, w.log()[-3000:]
            log = w.log()
            found = re.search(r"reached the end of the child's stdout for shard (\S+)", log)
            assert found is not None, log[-3000:]
            dead = found[1]
            assert "stopping the worker (exit status 1)" in log
            cps = await checkpoints(aws)
            assert cps[dead] == "TRIM_HORIZON"  # the batch it died in is not checkpointed
            got = w.deliveries()
            assert not [d for d in got if d.shard == dead]
            others = {shard for shard, _ in w.events()} - {dead}
            for shard in others:
                calls = [c for s, c in w.events() if s == shard]
                assert calls[-2:] == ["shutdownRequested", "leaseLost"], (shard, calls)
                # Checkpointed at its last delivered record (still at the start when the stop
                # came before its first batch).
                seqs = [d.seq for d in got if d.shard == shard]
                assert cps[shard] == (str(max(seqs)) if seqs else "TRIM_HORIZON")
            assert delivered(got) < sent
        finally:
            w.stop(kill=True)
