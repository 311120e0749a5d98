"""Local AWS emulators on 127.0.0.1: moto in this process (a thread) or in its own process, and
kinesis-local (the npm build of kinesis-mock) for what moto cannot do, such as resharding.

Owns: starting and stopping them and handing out matching ``ClientOptions``. Nothing here is used
by the library's normal path.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import attrs

from kclasync._adapters.aws import ClientOptions
from kclasync.errors import KclAsyncError

REGION = "us-east-1"

DEMO_EXTRA_HINT = "pip install 'kclasync[demo]'"


class MissingExtraError(KclAsyncError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def require_moto(what: str = "kclasync.testing") -> None:
    """Raise ``MissingExtraError`` unless moto (the AWS emulator) is importable."""
    if importlib.util.find_spec("moto") is None:
        raise MissingExtraError(
            f"{what} needs the AWS emulator moto, which is not installed: {DEMO_EXTRA_HINT}"
        )


@attrs.frozen
class LocalAws:
    """An emulator's address, and client options that reach it with dummy credentials."""

    endpoint_url: str
    kinesis_endpoint_url: str | None = None

    def client_options(self, **overrides: object) -> ClientOptions:
        kwargs: dict[str, object] = {
            "region_name": REGION,
            "endpoint_url": self.endpoint_url,
            "kinesis_endpoint_url": self.kinesis_endpoint_url,
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        }
        kwargs.update(overrides)
        return ClientOptions(**kwargs)  # type: ignore[arg-type]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def embedded_moto() -> Iterator[LocalAws]:
    """moto's server in a thread of this process, on a free 127.0.0.1 port. Its state (moto
    keeps it per process) is emptied on exit."""
    require_moto()
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    try:
        yield LocalAws(url)
    finally:
        # moto keeps its state in this process's memory, not in the server: empty it, so that
        # the next embedded server starts from nothing (the demo creates fixed names).
        with contextlib.suppress(OSError):
            urllib.request.urlopen(
                urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10
            ).close()
        server.stop()


@contextlib.contextmanager
def moto_process(timeout: float = 30.0) -> Iterator[LocalAws]:
    """moto's server in its own process (no GIL shared with the code under test)."""
    require_moto()
    port = free_port()
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
    proc = subprocess.Popen(
        [*cmd, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/moto-api/", timeout)
        yield LocalAws(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


KINESIS_LOCAL_SCRIPT = os.path.join("node_modules", "kinesis-local", "main.js")


def find_kinesis_local(start: str | None = None) -> str | None:
    """``node_modules/kinesis-local/main.js`` in ``start`` (default: the working directory) or
    the nearest parent directory that has it; None when ``npm ci`` has not installed it."""
    here = os.path.abspath(start or os.getcwd())
    while True:
        candidate = os.path.join(here, KINESIS_LOCAL_SCRIPT)
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


@contextlib.contextmanager
def kinesis_local(
    dynamodb: LocalAws,
    *,
    script: str | None = None,
    timeout: float = 30.0,
    durations: str = "100ms",
    grace: float = 0.5,
) -> Iterator[LocalAws]:
    """kinesis-local on free 127.0.0.1 ports, paired with ``dynamodb``'s endpoint (e.g. moto).

    ``durations`` sets how long stream creation and resharding stay in progress (the
    emulator's default is 500ms). kinesis-local ignores SIGTERM for a while, so it is stopped
    with SIGTERM and, after ``grace`` seconds, SIGKILL.
    """
    path = script or find_kinesis_local()
    if path is None:
        raise FileNotFoundError(
            "node_modules/kinesis-local/main.js not found: run `npm ci` at the repository root"
        )
    node = shutil.which("node")
    if node is None:
        raise FileNotFoundError("node is not installed (kinesis-local needs Node.js)")
    plain, tls = free_port(), free_port()
    env = {
        **os.environ,
        "KINESIS_MOCK_PLAIN_PORT": str(plain),
        "KINESIS_MOCK_TLS_PORT": str(tls),
        "SHOULD_PERSIST_DATA": "false",
        "LOAD_DATA_IF_EXISTS": "false",
        "LOG_LEVEL": "WARN",
        # Relative paths resolve against the working directory; the certificate ships with it.
        "KINESIS_MOCK_CERT_PATH": os.path.join(os.path.dirname(path), "server.json"),
    }
    for name in (
        "CREATE_STREAM_DURATION",
        "DELETE_STREAM_DURATION",
        "SPLIT_SHARD_DURATION",
        "MERGE_SHARDS_DURATION",
        "UPDATE_SHARD_COUNT_DURATION",
    ):
        env[name] = durations
    # The default allows 50 open shards in all; a test session creates many small streams.
    env.setdefault("SHARD_LIMIT", "10000")
    proc = subprocess.Popen(
        [node, path],
        env=env,
        cwd=os.path.dirname(path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Any HTTP answer (kinesis-local says 4xx to a bare GET) means it is listening.
        _wait_http(f"http://127.0.0.1:{plain}/", timeout)
        yield attrs.evolve(dynamodb, kinesis_endpoint_url=f"http://127.0.0.1:{plain}")
    finally:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
