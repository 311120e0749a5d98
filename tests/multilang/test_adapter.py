"""The adapter against scripted children (``fake_child.py``): the messages and their order as
the daemon writes them, checkpoint requests answered with kclasync's checkpoints and the
daemon's error strings, stderr logged with the shard id, a line that is not a message skipped,
and a failing child handled as the daemon handles it, without holding up another shard."""

from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import sys
from datetime import UTC, datetime

import pytest

from kclasync._core.leases.position import TRIM_HORIZON, Checkpoint
from kclasync._processor import ShardInfo
from kclasync._records import Record
from kclasync.errors import InvalidCheckpointError, LeaseLostError
from kclasync.multilang.adapter import MultiLangProcessor
from kclasync.multilang.child import Child, ChildFailedError, ChildTimeoutError

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]

FAKE = pathlib.Path(__file__).resolve().parent / "fake_child.py"
SEQ = "49590338271490256608559692538361571095921575989136588898"


class FakeCheckpointer:
    """The checkpointer contract (ours), recording what the adapter asked for."""

    def __init__(self, raise_on: type[Exception] | None = None) -> None:
        self.calls: list[tuple[str | None, int]] = []
        self.raise_on = raise_on
        self.last_delivered_position: Checkpoint | None = Checkpoint(SEQ)

    shard_id = "shardId-000000000001"
    last_checkpoint = TRIM_HORIZON

    @property
    def last_delivered(self) -> Checkpoint | None:
        return self.last_delivered_position

    async def checkpoint(
        self,
        sequence_number: str | None = None,
        sub_sequence_number: int = 0,
        *,
        persist: bool = True,
    ) -> None:
        if sequence_number is not None and not sequence_number.isdigit():
            raise InvalidCheckpointError("not a sequence number")
        if self.raise_on is not None:
            raise self.raise_on("shardId-000000000001")
        self.calls.append((sequence_number, sub_sequence_number))

    async def checkpoint_shard_end(self) -> None:
        self.calls.append(("SHARD_END", 0))

    async def prepare_checkpoint(
        self, sequence_number: str | None = None, sub_sequence_number: int = 0
    ) -> None:
        raise AssertionError("not used by the protocol")


def record(n: int) -> Record:
    return Record(
        data=b"\x00payload" + bytes([n]),
        partition_key=f"pk-{n}",
        sequence_number=SEQ,
        shard_id="shardId-000000000001",
        sub_sequence_number=n,
        approximate_arrival=datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
    )


SHARD = ShardInfo("s", "shardId-000000000001", "shardId-000000000001", Checkpoint(SEQ, 2))


class Harness:
    def __init__(self, tmp_path: pathlib.Path, mode: str, timeout: float | None = None) -> None:
        self.seen = tmp_path / f"{mode}.seen"
        self.failures: list[tuple[str, ChildFailedError, bool]] = []
        self.children: set[Child] = set()
        self.processor = MultiLangProcessor(
            [sys.executable, str(FAKE), str(self.seen), mode],
            on_failure=lambda *f: self.failures.append(f),
            children=self.children,
            timeout=timeout,
            close_grace=5.0,
        )

    def messages(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.seen.read_text().splitlines()]


async def test_messages_order_fields_and_checkpoint_answers(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "kclasync.multilang")
    h = Harness(tmp_path, "talk")
    cp = FakeCheckpointer()
    await h.processor.initialize(SHARD)
    await h.processor.process_records([record(0), record(1)], cp, 1234)
    lost = FakeCheckpointer(LeaseLostError)
    await h.processor.process_records([record(2)], lost, 0)
    await h.processor.shutdown_requested(cp)
    assert not h.failures and not h.children
    raw = h.seen.read_text().splitlines()
    assert raw[0] == (
        '{"action":"initialize","shardId":"shardId-000000000001",'
        f'"sequenceNumber":"{SEQ}","subSequenceNumber":2}}'
    )
    msgs = h.messages()
    assert [m["action"] for m in msgs] == [
        "initialize",
        "checkpoint",  # asked during initialize: no checkpointer
        "processRecords",
        "checkpoint",
        "checkpoint",
        "checkpoint",
        "processRecords",
        "checkpoint",
        "checkpoint",
        "checkpoint",
        "shutdownRequested",
        "leaseLost",
    ]
    assert msgs[1]["error"] == "InvalidStateException"
    first = msgs[2]
    assert list(first) == ["action", "records", "millisBehindLatest"]
    assert first["millisBehindLatest"] == 1234
    assert first["records"][0] == {  # type: ignore[index]
        "data": "AHBheWxvYWQA",
        "partitionKey": "pk-0",
        "sequenceNumber": SEQ,
        "approximateArrivalTimestamp": 1767323045678,
        "subSequenceNumber": 0,
        "action": "record",
    }
    assert list(msgs[3]) == ["action", "sequenceNumber", "subSequenceNumber", "error"]
    assert [m["error"] for m in msgs[3:6]] == ["IllegalArgumentException", None, None]
    assert [m["error"] for m in msgs[7:10]] == [
        "IllegalArgumentException",
        "ShutdownException",
        "ShutdownException",
    ]
    assert cp.calls == [(SEQ, 0), (None, 0)]
    logs = caplog.text
    assert (
        "Received error line from subprocess [starting up] for shard shardId-000000000001" in logs
    )
    assert (
        "Skipping unexpected line on STDOUT for shard shardId-000000000001: not a message" in logs
    )


async def test_shard_end_checkpoints_shard_end_and_closes(tmp_path: pathlib.Path) -> None:
    h = Harness(tmp_path, "ok")
    cp = FakeCheckpointer()
    await h.processor.initialize(SHARD)
    await h.processor.shard_ended(cp)
    assert [m["action"] for m in h.messages()][-1] == "shardEnded"
    assert not h.children and not h.failures


@pytest.mark.parametrize("mode", ["exit", "wrong"])
async def test_failing_child_stops_the_worker_as_the_daemon_does(
    tmp_path: pathlib.Path, mode: str
) -> None:
    h = Harness(tmp_path, mode)
    await h.processor.initialize(SHARD)
    cp = FakeCheckpointer()
    await h.processor.process_records([record(0)], cp, 0)  # returns: never hangs
    assert len(h.failures) == 1
    shard, error, abrupt = h.failures[0]
    assert shard == "shardId-000000000001" and not abrupt
    assert (
        ("end of the child's stdout" in str(error)) if mode == "exit" else "answered" in str(error)
    )
    await h.processor.process_records([record(1)], cp, 0)  # no more messages, no checkpoints
    await h.processor.lease_lost()
    assert cp.calls == [] and len(h.failures) == 1


async def test_timeout_is_abrupt(tmp_path: pathlib.Path) -> None:
    h = Harness(tmp_path, "silent", timeout=0.5)
    await h.processor.initialize(SHARD)
    await h.processor.process_records([record(0)], FakeCheckpointer(), 0)
    assert len(h.failures) == 1 and h.failures[0][2] is True
    assert isinstance(h.failures[0][1], ChildTimeoutError)
    for child in h.children:
        await child.proc.wait()


async def test_a_slow_child_holds_only_its_shard(tmp_path: pathlib.Path) -> None:
    slow, fast = Harness(tmp_path, "slow"), Harness(tmp_path, "ok")
    await asyncio.gather(slow.processor.initialize(SHARD), fast.processor.initialize(SHARD))
    slow_batch = asyncio.ensure_future(
        slow.processor.process_records([record(0)], FakeCheckpointer(), 0)
    )
    for n in range(5):
        await fast.processor.process_records([record(n)], FakeCheckpointer(), 0)
    assert not slow_batch.done()
    await slow_batch
    await asyncio.gather(slow.processor.lease_lost(), fast.processor.lease_lost())
    assert not slow.failures and not fast.failures
