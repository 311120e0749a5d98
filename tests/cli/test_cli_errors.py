"""Each expected failure of a ``kclasync`` command is one line on stderr and exit code 1, no
traceback unless ``--verbose``; run as a user runs it: the installed console script, in a
subprocess, against moto's server on 127.0.0.1."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kclasync._cli import build_parser
from kclasync._cli_errors import Target, explain
from kclasync.errors import StreamNotFoundError
from kclasync.testing.emulators import LocalAws, free_port

EXE = shutil.which("kclasync", path=os.path.dirname(sys.executable))


def _env(tmp_path: Path, **values: str) -> dict[str, str]:
    """An environment without the caller's AWS settings: no config files, no instance role."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_MAX_ATTEMPTS="1",
    )
    env.update(values)
    return env


CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    assert EXE is not None, "the kclasync console script is not installed"
    return subprocess.run(
        [EXE, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_no_region_and_verbose_traceback(tmp_path: Path) -> None:
    env = _env(tmp_path, **CREDS)
    line = one_line(run(env, "leases", "-a", "billing"))
    assert line == (
        "kclasync leases: error: no AWS region: pass --region or set AWS_DEFAULT_REGION"
    )
    verbose = run(env, "leases", "-a", "billing", "--verbose")
    assert verbose.returncode == 1
    assert verbose.stderr.startswith("Traceback (most recent call last):")
    assert "botocore.exceptions.NoRegionError" in verbose.stderr
    assert verbose.stderr.splitlines()[-1] == line


def test_no_credentials(tmp_path: Path) -> None:
    env = _env(tmp_path, AWS_DEFAULT_REGION="eu-west-1")
    line = one_line(run(env, "sticky", "pin", "shardId-1", "-a", "billing"))
    assert line.startswith(
        "kclasync sticky: error: no AWS credentials found: set AWS_ACCESS_KEY_ID"
    )


def test_missing_table(tmp_path: Path, moto: LocalAws, unique_name: str) -> None:
    env = _env(tmp_path, **CREDS)
    args = ("-a", unique_name, "--endpoint-url", moto.endpoint_url, "--region", "us-east-1")
    line = one_line(run(env, "leases", *args))
    assert line == (
        f"kclasync leases: error: lease table {unique_name!r} not found (region us-east-1, "
        f"endpoint {moto.endpoint_url}): check --application / --table, the region and the endpoint"
    )


def test_unreachable_endpoint(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    env = _env(tmp_path, **CREDS)
    args = ("leases", "-a", "billing", "--endpoint-url", url, "--region", "us-east-1")
    assert one_line(run(env, *args)) == (
        f"kclasync leases: error: cannot reach {url}/ (EndpointConnectionError): "
        "check the endpoint, the region and the network"
    )


@pytest.fixture(scope="module")
def moto_with_iam() -> Iterator[str]:
    """A moto server that checks IAM: the first two requests (creating a user and its key) are
    let through, every later one is authenticated and authorised."""
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "2"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        from kclasync.testing.emulators import _wait_http

        _wait_http(f"{url}/moto-api/", 30)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_access_denied(tmp_path: Path, moto_with_iam: str) -> None:
    import botocore.session

    iam = botocore.session.get_session().create_client(
        "iam",
        region_name="us-east-1",
        endpoint_url=moto_with_iam,
        aws_access_key_id="admin",
        aws_secret_access_key="admin",
    )
    iam.create_user(UserName="reader")  # no policy: may do nothing
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    args = ("-a", "billing", "--endpoint-url", moto_with_iam, "--region", "us-east-1")
    env = _env(
        tmp_path,
        AWS_ACCESS_KEY_ID=key["AccessKeyId"],
        AWS_SECRET_ACCESS_KEY=key["SecretAccessKey"],
    )
    where = f"(region us-east-1, endpoint {moto_with_iam})"
    assert one_line(run(env, "leases", *args)) == (
        f"kclasync leases: error: access denied {where}: Scan answered AccessDenied: "
        "User: arn:aws:iam::123456789012:user/reader is not authorized to perform: dynamodb:Scan"
    )
    unknown = _env(tmp_path, AWS_ACCESS_KEY_ID="AKIAUNKNOWN0000000000", AWS_SECRET_ACCESS_KEY="x")
    assert one_line(run(unknown, "sticky", "unpin", "shardId-1", *args)) == (
        f"kclasync sticky: error: access denied {where}: UpdateItem answered "
        "InvalidClientTokenId: The security token included in the request is invalid."
    )


def test_help_lists_every_command_on_one_line() -> None:
    result = subprocess.run(
        [EXE or "kclasync", "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    (sub,) = [a for a in build_parser()._actions if a.choices and a.dest == "command"]
    assert isinstance(sub.choices, dict)
    lines = result.stdout.splitlines()
    start = lines.index("  COMMAND") + 1
    listed = lines[start : lines.index("", start)]
    assert [line.split()[0] for line in listed] == list(sub.choices)
    for line in listed:
        assert re.fullmatch(r"    \S+ +\S.*", line), line


def test_stream_missing_and_unknown_errors_at_function_level() -> None:
    # No command reads a stream yet; a missing stream is worded like this wherever it is met.
    assert explain(StreamNotFoundError("orders")) == "stream 'orders' does not exist"
    # Anything unexpected is not an "expected failure": the CLI re-raises it with its traceback.
    assert explain(RuntimeError("bug"), Target(table="t")) is None
    try:
        raise ValueError("wrapped") from StreamNotFoundError("refunds")
    except ValueError as exc:
        assert explain(exc) == "stream 'refunds' does not exist"


async def test_sticky_on_a_missing_lease_is_worded_like_the_other_errors(
    tmp_path: Path, moto: LocalAws, unique_name: str
) -> None:
    import asyncio

    from tests.support import aws_for

    async with aws_for(moto, unique_name) as aws:
        await aws.store.ensure_table()
    env = _env(tmp_path, **CREDS)
    args = ("-a", unique_name, "--endpoint-url", moto.endpoint_url, "--region", "us-east-1")
    result = await asyncio.to_thread(run, env, "sticky", "pin", "shardId-9", *args)
    assert one_line(result) == (
        f"kclasync sticky: error: no lease 'shardId-9' in table {unique_name}"
    )


def test_demo_help_describes_the_demo_and_shows_every_default() -> None:
    result = subprocess.run(
        [EXE or "kclasync", "demo", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    text = " ".join(result.stdout.split())
    assert "Start an AWS emulator (moto) in this process" in text
    (sub,) = [a for a in build_parser()._actions if a.choices and a.dest == "command"]
    assert isinstance(sub.choices, dict)
    for action in sub.choices["demo"]._actions:
        if action.default in (None, False) or not action.option_strings:
            continue
        if action.default == "==SUPPRESS==":
            continue  # --help
        assert (
            f"({action.default:g})" in (action.help or "")
            if isinstance(action.default, float)
            else f"({action.default})" in (action.help or "")
        ), action.option_strings
    assert "records written before start (20000)" in text
