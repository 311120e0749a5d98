"""Fixtures of the in-memory adapter tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kclasync._adapters.memory import MemoryLeaseStore, MemoryLeaseTable
from tests.adapters.memory_helpers import FakeClock


@pytest.fixture
async def clock(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr(asyncio.get_running_loop(), "time", fake.time)
    yield fake


@pytest.fixture
def table() -> MemoryLeaseTable:
    return MemoryLeaseTable()


@pytest.fixture
def store(table: MemoryLeaseTable) -> MemoryLeaseStore:
    return MemoryLeaseStore(table)
