"""Shared fixtures: one moto server process per test session, on 127.0.0.1, and kinesis-local
(Kinesis only; DynamoDB stays on moto) for the tests that reshard."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from kclasync.testing.emulators import LocalAws, find_kinesis_local, kinesis_local, moto_process

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def moto() -> Iterator[LocalAws]:
    with moto_process() as aws:
        yield aws


@pytest.fixture(scope="session")
def kinesis(moto: LocalAws) -> Iterator[LocalAws]:
    """kinesis-local for Kinesis and the session's moto for DynamoDB. Installs the npm package
    from package-lock.json first when ``npm ci`` has not been run yet."""
    script = find_kinesis_local(str(ROOT))
    if script is None:
        npm = shutil.which("npm")
        assert npm is not None, "npm is needed to install kinesis-local (see package.json)"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=ROOT, check=True)
        script = find_kinesis_local(str(ROOT))
    assert script is not None, "npm ci did not install kinesis-local"
    with kinesis_local(moto, script=script) as aws:
        yield aws


@pytest.fixture
def unique_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"
