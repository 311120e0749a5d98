"""JSON logs: stable fields on every line, and no credentials or record payloads anywhere in the
output of a whole demo run (workers, a crash, failover) logging at DEBUG."""

from __future__ import annotations

import asyncio
import base64
import io
import logging
from collections.abc import Iterator

import orjson
import pytest

from kclasync._demo import DemoSettings, run_demo
from kclasync.logging import FIELDS, JsonFormatter, configure_logging, log_context

ACCESS_KEY = "AKIAKCLASYNCFAKE7Q2Z"
SECRET_KEY = "kclasyncFakeSecret/doNotLog+9f3k2LmQ"
FILLER = "kclasync demo record body"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_demo_run_logs_json_without_secrets_or_payloads(
    capfd: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    logs = io.StringIO()
    configure_logging(json=True, level=logging.DEBUG, stream=logs)
    out = io.StringIO()
    settings = DemoSettings(
        shards=2, workers=2, duration=4, rate=100, backlog=300, failover=1.0, record_size=120
    )
    code = asyncio.run(
        run_demo(
            settings,
            out,
            client_overrides={"aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY},
        )
    )
    assert code == 0, out.getvalue()
    captured = capfd.readouterr()
    lines = logs.getvalue().splitlines()
    parsed = [orjson.loads(line) for line in lines]
    # The run logged: shard sync, takes, the survivors' stops.
    assert {"shard_sync_of_created_leases", "worker_stopped"} <= {e["event"] for e in parsed}
    for entry in parsed:
        assert list(entry)[: len(FIELDS)] == list(FIELDS)
        assert set(entry) <= {*FIELDS, "exception"}
    # Lines logged by a worker's tasks say which worker.
    lease_lines = [e for e in parsed if e["logger"] == "kclasync.leases"]
    assert lease_lines and all(e["worker"] in ("worker-0", "worker-1") for e in lease_lines)

    everything = "\n".join([logs.getvalue(), out.getvalue(), captured.out, captured.err])
    record = orjson.dumps({"id": 0, "body": (FILLER + " ") * 5})[:40]
    forbidden = {
        ACCESS_KEY,
        SECRET_KEY,
        FILLER,
        base64.b64encode(record[:30]).decode(),  # a record's start, as the wire carries it
        base64.b64encode(SECRET_KEY.encode()).decode()[:20],
    }
    for secret in forbidden:
        assert secret not in everything, secret


def test_fields_from_context_and_extra() -> None:
    formatter = JsonFormatter()
    logger = logging.getLogger("kclasync.test")
    record = logger.makeRecord(
        "kclasync.test",
        logging.WARNING,
        __file__,
        1,
        "worker %s lost lease %s: %s",
        ("w1", "shardId-7", "counter moved"),
        None,
        extra={"lease_counter": 12},
    )
    with log_context(worker="w1", stream="orders", shard="shardId-7", lease_key="shardId-7"):
        entry = orjson.loads(formatter.format(record))
    assert entry["worker"] == "w1" and entry["stream"] == "orders"
    assert entry["shard"] == entry["lease_key"] == "shardId-7"
    assert entry["lease_counter"] == 12
    assert entry["event"] == "worker_lost_lease"
    assert entry["message"] == "worker w1 lost lease shardId-7: counter moved"
    assert entry["level"] == "WARNING" and entry["logger"] == "kclasync.test"
    # Outside the block the context is gone again.
    assert orjson.loads(formatter.format(record))["worker"] is None


def test_access_keys_and_signatures_are_masked() -> None:
    formatter = JsonFormatter()
    header = (
        f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/20260101/us-east-1/dynamodb/aws4_request, "
        "SignedHeaders=host, Signature=0123abcd"
    )
    record = logging.getLogger("x").makeRecord(
        "x", logging.INFO, __file__, 1, "sent %s with key %s", (header, ACCESS_KEY), None
    )
    message = orjson.loads(formatter.format(record))["message"]
    assert ACCESS_KEY not in message and "0123abcd" not in message
    assert message.count("[redacted]") == 3
