"""How a fan-out call fails, in kclasync's terms: the fan-out errors and the mapping onto them.

Owns: the errors only fan-out raises (a subscription still in use, a dropped event stream, a
stream consumer that is gone or not ACTIVE in time), all subclasses of the adapter errors so
that code written for polling handles them too, and the mapping of a Kinesis error code, an
unreadable event stream or a broken connection onto kclasync's errors.
Must not: call AWS, retry, or decide what to do about a failure (``_core.records.fanout_session``
decides; the runtime acts).
"""

from __future__ import annotations

import aiohttp
from botocore.eventstream import ParserError
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from kclasync._adapters.kinesis import THROTTLING_CODES, TRANSIENT_CODES
from kclasync.errors import AdapterError, ThrottledError, TransientError

#: A connection that failed, timed out or broke off.
CONNECTION_ERRORS = (TimeoutError, aiohttp.ClientError, OSError, BotoCoreError)


class SubscriptionInUseError(TransientError):
    """Another subscription of this consumer to this shard is still active (ResourceInUse):
    it ends within seconds; subscribe again after a pause."""


class SubscriptionDroppedError(TransientError):
    """The event stream broke off: the connection dropped, timed out, or a frame was damaged."""


class ConsumerNotFoundError(AdapterError):
    """The stream consumer (fan-out registration) no longer exists."""

    def __init__(self, consumer_arn: str) -> None:
        self.consumer_arn = consumer_arn
        super().__init__(f"stream consumer {consumer_arn} does not exist")


class ConsumerNotActiveError(TransientError):
    """A stream consumer did not become ACTIVE within the allowed time."""


def error_code(exc: ClientError) -> str:
    """The AWS error code of a failed call ("" when the response names none)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def mapped_error(exc: BaseException, what: str) -> BaseException | None:
    """The kclasync error for ``exc`` (None: not ours to map)."""
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code == "ResourceInUseException":
            return SubscriptionInUseError(f"{what}: another subscription is active")
        if code in THROTTLING_CODES:
            return ThrottledError(f"{what} throttled: {code}")
        if code in TRANSIENT_CODES:
            return TransientError(f"{what} failed: {code}")
        return None
    if isinstance(exc, (ParserError, ResponseParserError)):
        return SubscriptionDroppedError(f"{what}: unreadable event stream: {exc}")
    if isinstance(exc, CONNECTION_ERRORS):
        return SubscriptionDroppedError(f"{what}: connection failed: {exc!r}")
    return None
