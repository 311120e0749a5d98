"""A direct request path for the hot calls, on the clients kclasync creates from its own session.

A worker's steady load is a renewal (``UpdateItem``) per lease per renewer period, a
``GetRecords`` per shard per pause, and its worker-registry heartbeats and reads (``UpdateItem``,
``Scan``). botocore makes each one through a dozen event hooks, a parameter walk, an
endpoint-ruleset evaluation, request preparation and a retry handler. Here those calls are made
directly: the JSON body is the parameters as orjson writes them (the JSON protocol's body for
the str/int/list/dict values the adapters pass), the headers are the ones botocore sends, the
signature is SigV4 (``sigv4``: botocore's header, computed for this one request form) with the
client's credentials (frozen per call, so refreshable credentials keep refreshing), the request
is sent by ``http_transport`` with the client's HTTP settings (timeouts, pool size, keep-alive,
TLS), or through the client's own HTTP session where that transport cannot stand in for it (a
proxy applies, custom connector arguments), and the response, successful or not, is parsed by
the client's own parser. The endpoint and signing scope come from the client's endpoint
ruleset, evaluated once per operation, table and account.

What comes back is what botocore's call would return or raise, decided by ``direct_outcomes``:
a parsed success, or the client's own exception class for an error botocore would not retry
(a failed condition, a missing table or shard, an expired iterator, a validation error).
Anything else (throttling, a server error, a failed connection, a checksum mismatch, a body
or parameter this path does not know) is made again as an ordinary botocore call, which applies
the client's retry policy and raises botocore's exception: at most one request more than
before, never a different result.

Owns: ``enable`` (marks a client), ``close`` (its kept connections), ``call`` (one call,
direct when the client is marked and the operation is one of ``OPERATIONS``, else botocore's),
``DirectCaller`` (request building, signing, sending; the endpoint cache) and its counters.
Must not: retry by itself, decide anything about leases or records, or touch a client or
session the user made.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
import uuid
import weakref
from typing import Any
from urllib.parse import quote

import orjson
from aiobotocore.context import start_as_current_context
from botocore.configprovider import NEW_RETRIES_ENABLED

from kclasync._adapters import direct_outcomes, http_transport
from kclasync._adapters.sigv4 import Scope

log = logging.getLogger("kclasync.aws")

#: Operations made directly, with the botocore client method that makes them otherwise.
OPERATIONS = {"UpdateItem": "update_item", "GetRecords": "get_records", "Scan": "scan"}

_CALLERS: weakref.WeakKeyDictionary[Any, DirectCaller] = weakref.WeakKeyDictionary()


def enable(client: Any) -> None:
    """Make ``client``'s hot calls direct (a client kclasync made from its own session)."""
    try:
        _CALLERS[client] = DirectCaller(client)
    except (AttributeError, TypeError, KeyError) as exc:  # another aiobotocore: botocore's path
        log.debug("direct requests unavailable on %r: %s", client, exc)


def close(client: Any) -> None:
    """Close the connections ``client``'s direct path keeps (when the client is closed)."""
    caller = _CALLERS.pop(client, None)
    if caller is not None and caller.transport is not None:
        caller.transport.close()


def caller_for(client: Any) -> DirectCaller | None:
    """The direct caller of ``client``, or None when its calls go through botocore."""
    return _CALLERS.get(client)


async def call(client: Any, operation: str, params: dict[str, Any]) -> dict[str, Any]:
    """``operation`` with ``params`` on ``client``: what botocore's call returns or raises."""
    caller = _CALLERS.get(client)
    if caller is not None and operation in OPERATIONS:
        parsed = await caller.call(operation, params)
        if parsed is not None:
            return parsed
        caller.fallbacks += 1
    result: dict[str, Any] = await getattr(client, OPERATIONS[operation])(**params)
    return result


class _Request:
    """The request as the signer and the client's HTTP session read it."""

    __slots__ = ("body", "context", "headers", "method", "params", "stream_output", "url")

    def __init__(self, url: str, headers: dict[str, str], body: bytes) -> None:
        self.method = "POST"
        self.url = url
        self.headers = headers
        self.body = body
        self.params: dict[str, str] = {}
        self.context: dict[str, Any] = {}
        self.stream_output = False


class _Target:
    """Where one operation goes, and how it is signed (from the client's endpoint ruleset)."""

    __slots__ = ("headers", "origin", "scope", "url")

    def __init__(
        self, url: str, headers: dict[str, str], scope: Scope, origin: http_transport.Origin | None
    ) -> None:
        self.url = url
        #: Where ``http_transport`` sends it; None: through the client's HTTP session.
        self.origin = origin
        #: The ruleset's headers, and the User-Agent botocore sends for this operation.
        self.headers = headers
        self.scope = scope


class DirectCaller:
    """Makes ``OPERATIONS`` on one aiobotocore client without botocore's per-call machinery."""

    def __init__(self, client: Any) -> None:
        self._client = client
        model = client.meta.service_model
        if model.protocol != "json" or client._request_signer._signature_version != "v4":
            raise TypeError("only JSON-protocol services signed with SigV4")
        self._http = client._endpoint.http_session
        #: kclasync's own HTTP/1.1 transport, standing in for the client's session when it can.
        self.transport = http_transport.for_session(self._http)
        self._parser = client._endpoint._response_parser_factory.create_parser("json")
        self._signer = client._request_signer
        self._content_type = f"application/x-amz-json-{model.metadata['jsonVersion']}"
        self._target_prefix = model.metadata["targetPrefix"]
        # botocore's first-attempt ``amz-sdk-request`` header: the maximum is seeded only
        # with its new retries enabled, in the standard and adaptive modes.
        retries = client.meta.config.retries or {}
        total = retries.get("total_max_attempts")
        seeded = NEW_RETRIES_ENABLED and retries.get("mode") in ("standard", "adaptive")
        self._attempt = f"attempt=1; max={total}" if seeded and total else "attempt=1"
        self._operations = {
            name: model.operation_model(name)
            for name in OPERATIONS
            if name in model.operation_names
        }
        self._targets: dict[tuple[str, str, str | None], _Target | None] = {}
        #: Calls made directly, and calls handed to botocore after a direct attempt.
        self.direct = 0
        self.fallbacks = 0

    async def _target(self, op: Any, params: dict[str, Any], account: str | None) -> _Target | None:
        key = (op.name, str(params.get("TableName", "")), account)
        if key in self._targets:
            return self._targets[key]
        context: dict[str, Any] = {
            "client_region": self._client.meta.region_name,
            "client_config": self._client.meta.config,
            "has_streaming_input": False,
            "auth_type": op.resolved_auth_type,
            "unsigned_payload": op.unsigned_payload,
            "auth_options": self._client.meta.service_model.metadata.get("auth"),
        }
        async with start_as_current_context():
            # The features the resolution registers (an account id mode) go in the User-Agent
            # header, as in botocore's call.
            url, headers, _ = await self._client._resolve_endpoint_ruleset(op, params, context)
            user_agent: str = self._client._user_agent_creator.to_string()
        signing = context.get("signing", {})
        auth = context.get("auth_type") or "v4"
        target = None
        if auth == "v4" and url and "?" not in url:
            region = signing.get("region") or self._client.meta.region_name
            name = signing.get("signing_name") or self._client.meta.service_model.signing_name
            fixed = {**(headers or {}), "User-Agent": user_agent}
            scope = Scope(url, region, name)
            origin = None
            if self.transport is not None and not http_transport.proxied(self._http, url):
                origin = http_transport.Origin.of(url, scope.host)
            target = _Target(url, fixed, scope, origin)
        self._targets[key] = target
        return target

    def _headers(self, operation: str, target: _Target) -> dict[str, str]:
        headers = {
            "X-Amz-Target": f"{self._target_prefix}.{operation}",
            "Content-Type": self._content_type,
            **target.headers,
        }
        trace = os.environ.get("_X_AMZN_TRACE_ID")
        if trace and "AWS_LAMBDA_FUNCTION_NAME" in os.environ:
            headers["X-Amzn-Trace-Id"] = quote(trace, safe="-=;:+&[]{}\"',")
        return headers

    async def call(self, operation: str, params: dict[str, Any]) -> dict[str, Any] | None:
        """The parsed response, or raises the client's exception for a final error; None:
        make the call through botocore instead."""
        op = self._operations.get(operation)
        if op is None:
            return None
        try:
            # Only JSON values: bytes and datetimes (serialised differently by botocore) fail.
            body = orjson.dumps(params, option=orjson.OPT_PASSTHROUGH_DATETIME)
        except TypeError:
            return None
        credentials = self._signer._credentials
        if credentials is None:
            return None  # botocore raises NoCredentialsError
        try:
            frozen = credentials.get_frozen_credentials()  # refreshed when near expiry
            if inspect.isawaitable(frozen):
                frozen = await frozen
            target = await self._target(op, params, getattr(frozen, "account_id", None))
        except Exception as exc:  # a refresh or an endpoint that fails: botocore raises it
            log.debug("direct %s not made (%s); made through botocore", operation, exc)
            return None
        if target is None:
            return None
        headers = self._headers(operation, target)
        target.scope.sign(
            headers,
            body,
            time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()),
            frozen.access_key,
            frozen.secret_key,
            frozen.token,
        )
        # Added after signing, as botocore does (they are not signed).
        headers["amz-sdk-invocation-id"] = str(uuid.uuid4())
        headers["amz-sdk-request"] = self._attempt
        try:
            if target.origin is not None and self.transport is not None:
                status, answer, content = await self.transport.post(target.origin, headers, body)
            else:
                response = await self._http.send(_Request(target.url, headers, body))
                status, answer, content = (
                    response.status_code,
                    response.headers,
                    await response.content,
                )
        except Exception as exc:  # connection, timeout, framing: botocore's retries decide
            log.debug("direct %s failed (%s); made through botocore", operation, exc)
            return None
        self.direct += 1
        parsed = await direct_outcomes.outcome(
            self._client, self._parser, op, status, answer, content
        )
        if parsed is None:
            log.debug(
                "direct %s answered %s %.200r; made through botocore", operation, status, content
            )
        return parsed
