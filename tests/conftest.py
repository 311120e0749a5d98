"""Shared fixtures: one moto server process per test session, on 127.0.0.1."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from kclasync.testing.emulators import LocalAws, moto_process


@pytest.fixture(scope="session")
def moto() -> Iterator[LocalAws]:
    with moto_process() as aws:
        yield aws


@pytest.fixture
def unique_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"
