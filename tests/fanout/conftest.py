"""Fixtures of the fan-out tests: a local server speaking the service's event-stream framing
(``kclasync.testing.eventstream``) and a fan-out client of it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from kclasync._adapters.fanout import FanOutClient
from kclasync.testing.eventstream import FanOutServer

SESSION = get_session()  # one session: the service model is loaded once


@pytest.fixture
async def server() -> AsyncIterator[FanOutServer]:
    srv = FanOutServer(heartbeat=0.05, lifetime=2.0)
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture
async def fanout(server: FanOutServer) -> AsyncIterator[FanOutClient]:
    config = AioConfig(retries={"total_max_attempts": 1}, read_timeout=5, connect_timeout=2)
    async with SESSION.create_client(
        "kinesis",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="a",
        aws_secret_access_key="b",
        config=config,
    ) as client:
        yield FanOutClient(client)
