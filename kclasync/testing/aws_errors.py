"""Error answers as DynamoDB and Kinesis send them, for the fault and limit proxies.

Both services speak JSON 1.x: an error is an HTTP status (400 for throttling and other client
errors, 500 or 503 for server failures), a ``Content-Type`` of ``application/x-amz-json-1.0``
(DynamoDB) or ``-1.1`` (Kinesis), an ``x-amzn-RequestId`` header, and a body
``{"__type": "<namespace>#<Code>", "message": "..."}`` (DynamoDB puts its API namespace before the
``#``; Kinesis sends the bare code). DynamoDB adds ``x-amz-crc32``, the CRC32 of the body, which
botocore checks. The messages are the services' own wording for each case.

Owns: the status, headers and body of each error answer. Must not: decide when to send one.
"""

from __future__ import annotations

import uuid
import zlib

import orjson

DYNAMODB = "dynamodb"
KINESIS = "kinesis"

_DDB_NS = "com.amazonaws.dynamodb.v20120810"
_CORAL = "com.amazon.coral.availability"

#: The message each service sends with each code (``{stream}``/``{shard}`` filled in when known).
MESSAGES: dict[tuple[str, str], str] = {
    (DYNAMODB, "ProvisionedThroughputExceededException"): (
        "The level of configured provisioned throughput for the table was exceeded. "
        "Consider increasing your provisioning level with the UpdateTable API."
    ),
    (DYNAMODB, "ThrottlingException"): "Rate of requests exceeds the allowed throughput.",
    (DYNAMODB, "LimitExceededException"): (
        "Subscriber limit exceeded: Only 10 tables can be created, updated, or deleted "
        "simultaneously"
    ),
    (DYNAMODB, "InternalServerError"): "Internal server error",
    (DYNAMODB, "ServiceUnavailable"): "Service Unavailable",
    (KINESIS, "ProvisionedThroughputExceededException"): (
        "Rate exceeded for shard {shard} in stream {stream} under account 123456789012."
    ),
    (KINESIS, "LimitExceededException"): "Rate exceeded for stream {stream} under account "
    "123456789012.",
    (KINESIS, "ThrottlingException"): "Rate exceeded",
    (KINESIS, "ExpiredIteratorException"): "Iterator expired. The iterator was created at time "
    "{created} while right now it is {now} which is further in the future than the tolerated "
    "delay of {tolerated} milliseconds.",
    (KINESIS, "ResourceInUseException"): "Another active subscription exists for consumer "
    "{consumer} and shard {shard}.",
    (KINESIS, "InternalFailure"): "Internal service failure.",
    (KINESIS, "ServiceUnavailable"): "Service Unavailable",
}

_NAMESPACE = {
    (DYNAMODB, "ThrottlingException"): _CORAL,
    (DYNAMODB, "ServiceUnavailable"): _CORAL,
}


def error_answer(
    service: str, code: str, status: int = 400, **fields: str
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of the error ``code`` from ``service``; ``fields`` fill the
    message's placeholders (``stream``, ``shard``, ...), unknown ones are left as ``?``."""
    template = MESSAGES.get((service, code), code)
    message = template.format_map(_Blank(fields))
    if service == DYNAMODB:
        kind = f"{_NAMESPACE.get((service, code), _DDB_NS)}#{code}"
        content_type = "application/x-amz-json-1.0"
    else:
        kind = code
        content_type = "application/x-amz-json-1.1"
    body = orjson.dumps({"__type": kind, "message": message})
    headers = {"Content-Type": content_type, "x-amzn-RequestId": str(uuid.uuid4())}
    if service == DYNAMODB:
        headers["x-amz-crc32"] = str(zlib.crc32(body))
    else:
        headers["x-amz-id-2"] = uuid.uuid4().hex
    return status, headers, body


class _Blank(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "?"


#: Server failures: (status, code) per service.
SERVER_ERRORS: dict[int, dict[str, str]] = {
    500: {DYNAMODB: "InternalServerError", KINESIS: "InternalFailure"},
    503: {DYNAMODB: "ServiceUnavailable", KINESIS: "ServiceUnavailable"},
}

#: Control-plane operations (their throttling answer is LimitExceededException).
CONTROL_PLANE = frozenset(
    {
        "CreateTable",
        "DescribeTable",
        "UpdateTable",
        "DeleteTable",
        "CreateStream",
        "DescribeStream",
        "DescribeStreamSummary",
        "ListShards",
        "ListStreams",
        "RegisterStreamConsumer",
        "DescribeStreamConsumer",
        "DeregisterStreamConsumer",
        "ListStreamConsumers",
        "SubscribeToShard",
    }
)


def throttling_codes(service: str, operation: str) -> tuple[str, ...]:
    """The throttling codes ``service`` answers ``operation`` with."""
    if operation in CONTROL_PLANE:
        return ("LimitExceededException",)
    if service == DYNAMODB:
        return ("ProvisionedThroughputExceededException", "ThrottlingException")
    return ("ProvisionedThroughputExceededException",)
