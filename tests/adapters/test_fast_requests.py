"""The fast request path on the clients kclasync creates sends what botocore would send.

Two clients from one session, one with ``fast_requests`` and one without, make the same calls on
moto: both succeed, and the User-Agent headers they send are the same (feature ids compared as
sets: botocore joins a set). The fast client skips parameter validation; the other client, made
after it from the same session, still validates: the session was not changed.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiobotocore.session import get_session
from botocore.exceptions import ParamValidationError

from kclasync.testing.emulators import LocalAws

pytestmark = pytest.mark.asyncio


def _agents(client: Any) -> list[str]:
    sent: list[str] = []

    def note(request: Any, **kwargs: Any) -> None:
        sent.append(request.headers["User-Agent"].decode())

    client.meta.events.register("before-send.kinesis", note)
    return sent


def _parts(agent: str) -> tuple[set[str], set[str]]:
    tokens = set(agent.split(" "))
    features = {t for t in tokens if t.startswith("m/")}
    return tokens - features, {f for t in features for f in t[2:].split(",")}


async def test_same_user_agent_and_the_session_unchanged(moto: LocalAws, unique_name: str) -> None:
    session = get_session()
    fast = moto.client_options(session=session, fast_requests=True)
    plain = moto.client_options(session=session, fast_requests=False)
    async with fast.create_client("kinesis") as f, plain.create_client("kinesis") as p:
        sent_fast, sent_plain = _agents(f), _agents(p)
        await f.create_stream(StreamName=unique_name, ShardCount=1)
        for client in (f, p, f, p):
            await client.list_shards(StreamName=unique_name)
        assert len(sent_fast) == 3 and len(sent_plain) == 2
        assert len(set(sent_fast[1:])) == 1  # built once, reused
        assert _parts(sent_fast[-1]) == _parts(sent_plain[-1])
        # botocore still validates on the plain client; the fast one leaves it to the server.
        with pytest.raises(ParamValidationError):
            await p.list_shards(StreamName=unique_name, MaxResults="ten")
        with pytest.raises(Exception) as server_side:
            await f.list_shards(StreamName=unique_name, MaxResults="ten")
        assert not isinstance(server_side.value, ParamValidationError)
