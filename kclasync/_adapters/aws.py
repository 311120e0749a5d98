"""Creating the aiobotocore clients a consumer needs.

Owns: turning the user's client options (a session, region, endpoint URL, credentials) into
DynamoDB and Kinesis clients with timeouts and retry settings suited to lease renewal. Every
request of those clients goes out through aiobotocore's own HTTP session (aiohttp), signed by
botocore's signer with the client's credentials, and is retried by botocore's retry handler.
Must not: hold protocol logic, send or sign a request itself, or change a session or client the
user passed in.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import attrs
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from kclasync._adapters import fast_parse, fast_requests


@attrs.frozen(kw_only=True)
class ClientOptions:
    """How to reach AWS.

    ``session`` may be an aiobotocore ``AioSession`` or an ``aioboto3.Session``.
    """

    region_name: str | None = None
    endpoint_url: str | None = None
    dynamodb_endpoint_url: str | None = None
    kinesis_endpoint_url: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None
    session: Any = None
    #: Per-request timeouts; a renewal must fail well within the failover time.
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    max_attempts: int = 3
    #: Parse GetRecords and DynamoDB item responses with kclasync's fast parser (same result as
    #: botocore's, a fraction of the CPU), on the clients kclasync creates. None: on when
    #: kclasync creates the session, off for clients made from a ``session`` you pass in; True:
    #: on for those too (your session itself is not changed); False: botocore's parser.
    fast_parsing: bool | None = None
    #: Skip per-call work whose result never changes on the clients kclasync creates (request
    #: parameter validation; rebuilding the User-Agent header for every request). The session,
    #: yours or kclasync's, is not changed. False: botocore's request path unchanged.
    fast_requests: bool = True

    def _kwargs(self, endpoint: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "config": AioConfig(
                connect_timeout=self.connect_timeout,
                read_timeout=self.read_timeout,
                retries={"max_attempts": self.max_attempts, "mode": "standard"},
                max_pool_connections=64,
                **(fast_requests.CLIENT_CONFIG if self.fast_requests else {}),
            )
        }
        for name in (
            "region_name",
            "aws_access_key_id",
            "aws_secret_access_key",
            "aws_session_token",
        ):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        if endpoint is not None:
            kwargs["endpoint_url"] = endpoint
        return kwargs

    def new_session(self) -> Any:
        """The session clients are made from: the one passed in, or a new aiobotocore session
        (made once per consumer: its loaded service data is shared by both clients)."""
        return self.session if self.session is not None else get_session()

    def create_client(
        self, service: str, session: Any = None
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        """A client for ``service`` from ``session`` (default: ``new_session()``)."""
        endpoint = {
            "dynamodb": self.dynamodb_endpoint_url,
            "kinesis": self.kinesis_endpoint_url,
        }.get(service) or self.endpoint_url
        if session is None:
            session = self.new_session()
        parse = self.fast_parsing or (self.fast_parsing is None and self.session is None)
        kwargs = self._kwargs(endpoint)
        made: contextlib.AbstractAsyncContextManager[Any]
        if hasattr(session, "create_client"):  # aiobotocore AioSession
            made = session.create_client(service, **kwargs)
        elif hasattr(session, "client"):  # aioboto3.Session
            made = session.client(service, **kwargs)
        else:
            raise TypeError(f"session must be an aiobotocore or aioboto3 session, got {session!r}")
        if not (self.fast_requests or parse):
            return made
        return _lean(made, requests=self.fast_requests, parse=bool(parse))


@contextlib.asynccontextmanager
async def _lean(
    made: contextlib.AbstractAsyncContextManager[Any], *, requests: bool, parse: bool
) -> AsyncIterator[Any]:
    """The client, with the fast request path and parser installed on it (not on its session)."""
    async with made as client:
        if requests:
            fast_requests.install(client)
        if parse:
            fast_parse.install(client)
        yield client
