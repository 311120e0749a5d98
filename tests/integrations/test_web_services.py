"""The integration examples, run as written: each module docstring's service started in its
own process (uvicorn for FastAPI, ``web.run_app`` for aiohttp) against a moto server over real
HTTP; probed, scraped, then stopped with SIGTERM, after which the lease table must show every
lease released."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import botocore.session
import pytest

import kclasync.integrations.aiohttp
import kclasync.integrations.asgi
from kclasync.testing.emulators import LocalAws, free_port, moto_process

pytestmark = pytest.mark.timeout(240)

SHARDS = 2


def example(module: ModuleType) -> str:
    """The indented code block of ``module``'s docstring (from its first line to the prose)."""
    doc = inspect.getdoc(module) or ""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    "))
    end = next(i for i in range(start, len(lines)) if lines[i] and not lines[i].startswith("    "))
    return textwrap.dedent("\n".join(lines[start:end])).strip() + "\n"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def poll(url: str, check: object, timeout: float, proc: subprocess.Popen[str]) -> str:
    """GET ``url`` until ``check(status, body)`` holds; fails early if the service died."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the service exited: {proc.communicate()}"
        try:
            status, body = get(url)
            last = (status, body)
            if check(status, body):  # type: ignore[operator]
                return body
        except OSError as exc:  # not listening yet
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"{url} never passed the check; last answer: {last!r}")


@pytest.fixture
def aws() -> Iterator[LocalAws]:
    """A moto server of its own (the examples use fixed names) with the stream 'orders'."""
    with moto_process() as local:
        kinesis = _client("kinesis", local)
        kinesis.create_stream(StreamName="orders", ShardCount=SHARDS)
        kinesis.get_waiter("stream_exists").wait(StreamName="orders")
        yield local


def _client(service: str, local: LocalAws) -> object:
    return botocore.session.get_session().create_client(
        service,
        region_name="us-east-1",
        endpoint_url=local.endpoint_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def run_service(
    module: ModuleType, aws: LocalAws, tmp_path: Path
) -> tuple[subprocess.Popen[str], str]:
    (tmp_path / "service.py").write_text(example(module))
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "AWS_ENDPOINT_URL": aws.endpoint_url,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "PORT": str(port),
    }
    if module is kclasync.integrations.asgi:
        cmd = [sys.executable, "-m", "uvicorn", "service:app", "--host", "127.0.0.1"]
        cmd += ["--port", str(port)]
    else:
        cmd = [sys.executable, "service.py"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    "module",
    [kclasync.integrations.asgi, kclasync.integrations.aiohttp],
    ids=["fastapi", "aiohttp"],
)
def test_example_service_probes_metrics_and_sigterm(
    module: ModuleType, aws: LocalAws, tmp_path: Path
) -> None:
    proc, base = run_service(module, aws, tmp_path)
    try:
        ready = poll(f"{base}/readyz", lambda s, b: s == 200, 90, proc)
        (health,) = json.loads(ready)["consumers"]
        worker = health["worker_id"]
        assert health["running"] is True and health["error"] is None
        # Leases are taken after start-up; wait for both shards' leases.
        poll(f"{base}/livez", lambda s, b: _leases_held(b) == SHARDS, 60, proc)
        if module is kclasync.integrations.asgi:
            # A plain `def` endpoint: FastAPI runs it in a worker thread, away from the loop.
            status, body = get(f"{base}/healthz")
            assert status == 200, body
            assert json.loads(body)["leases"] == SHARDS
        status, metrics = get(f"{base}/metrics")
        assert status == 200
        held = f'kclasync_leases_held{{application="billing",worker="{worker}"}} {SHARDS}.0'
        assert held in metrics
        owners = {item["leaseOwner"]["S"] for item in _leases(aws)}
        assert owners == {worker}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    # uvicorn re-raises the signal once it has shut down gracefully; aiohttp exits 0.
    assert proc.returncode in (0, -signal.SIGTERM), err
    if module is kclasync.integrations.asgi:
        assert "Application shutdown complete." in err
    leases = _leases(aws)
    assert len(leases) == SHARDS
    # Released on SIGTERM (no owner), not left to expire.
    assert [item.get("leaseOwner") for item in leases] == [None] * SHARDS, leases


def _leases_held(body: str) -> int:
    return int(json.loads(body)["consumers"][0]["leases"])


def _leases(aws: LocalAws) -> list[dict[str, dict[str, str]]]:
    items = _client("dynamodb", aws).scan(TableName="billing", ConsistentRead=True)["Items"]  # type: ignore[attr-defined]
    return [item for item in items if "leaseCounter" in item and "checkpoint" in item]
