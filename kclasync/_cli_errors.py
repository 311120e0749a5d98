"""Expected failures of ``kclasync`` commands, turned into one line a person can act on.

Owns: recognising the errors a command meets in normal use (no region, no credentials, a missing
table or stream, an unreachable endpoint, access denied, a missing extra) and wording them.
Must not: print, exit or decide on tracebacks (``_cli`` does), or swallow anything it does not
recognise (``explain`` returns None and the error propagates with its traceback: a bug).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import attrs

from kclasync.errors import ConfigError, StreamNotFoundError


@attrs.frozen
class Target:
    """What the command was pointed at, to name it in the message."""

    table: str | None = None
    region: str | None = None
    endpoint_url: str | None = None


# Codes AWS (and emulators) answer when the caller may not do something or is not recognised.
_DENIED = {
    "AccessDenied",
    "AccessDeniedException",
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "InvalidSignatureException",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "ExpiredTokenException",
    "MissingAuthenticationTokenException",
    "NotAuthorized",
}


_XML_ERROR = re.compile(r"<Code>(?P<code>[^<]+)</Code>\s*<Message>(?P<message>[^<]*)</Message>")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from (``__cause__``, then ``__context__``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _where(target: Target) -> str:
    parts = []
    if target.region:
        parts.append(f"region {target.region}")
    if target.endpoint_url:
        parts.append(f"endpoint {target.endpoint_url}")
    return f" ({', '.join(parts)})" if parts else ""


def explain(exc: BaseException, target: Target = Target()) -> str | None:
    """One line describing ``exc`` if it is an expected failure, else None."""
    from botocore import exceptions as bx

    from kclasync.testing.emulators import MissingExtraError

    for err in _chain(exc):
        if isinstance(err, MissingExtraError | StreamNotFoundError | ConfigError):
            return str(err)
        if isinstance(err, bx.NoRegionError):
            return "no AWS region: pass --region or set AWS_DEFAULT_REGION"
        if isinstance(err, bx.NoCredentialsError | bx.PartialCredentialsError):
            return (
                "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "or AWS_PROFILE, or run with an instance or task role"
            )
        if isinstance(err, bx.ProfileNotFound):
            return f"{err}: check AWS_PROFILE and ~/.aws/config"
        if isinstance(
            err, bx.EndpointConnectionError | bx.ConnectTimeoutError | bx.ReadTimeoutError
        ):
            url = getattr(err, "kwargs", {}).get("endpoint_url") or target.endpoint_url
            return (
                f"cannot reach {url or 'the AWS endpoint'} ({type(err).__name__}): "
                "check the endpoint, the region and the network"
            )
        if isinstance(err, bx.ClientError):
            return _client_error(err, target)
    return None


def _client_error(err: object, target: Target) -> str:
    response = getattr(err, "response", {}) or {}
    error = response.get("Error", {})
    code = str(error.get("Code", "Unknown"))
    message = str(error.get("Message", "")).strip() or code
    operation = getattr(err, "operation_name", "?")
    # An answer in the other protocol's shape (an XML error to a JSON service, as some
    # emulators and proxies send) leaves botocore with the HTTP status as the code.
    if xml := _XML_ERROR.search(message):
        code, message = xml["code"], xml["message"]
    elif code == "403":
        code = "AccessDenied"
    message = " ".join(message.split())
    if code in _DENIED:
        return f"access denied{_where(target)}: {operation} answered {code}: {message}"
    if code == "ResourceNotFoundException":
        if target.table:
            return (
                f"lease table {target.table!r} not found{_where(target)}: "
                "check --application / --table, the region and the endpoint"
            )
        return f"not found{_where(target)}: {operation}: {message}"
    return f"AWS error{_where(target)}: {operation} answered {code}: {message}"
