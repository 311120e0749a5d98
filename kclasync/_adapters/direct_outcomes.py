"""What a direct request's response means: botocore's result, botocore's exception, or "ask
botocore".

The body is parsed by the client's own parser (so a success is the same dict botocore's call
returns, and an error the same ``Error`` and modeled fields), and an error is raised as the
client's own exception class for its code (``client.exceptions.from_code``, as botocore's call
does), so the adapters' error mapping sees identical types. Only errors botocore never retries
are final here (``FINAL_CODES``); throttling, server errors, unknown codes and a DynamoDB body
whose CRC32 does not match its ``x-amz-crc32`` header (botocore retries those) return None: the
caller then makes the call through botocore, which applies the client's retry policy.

Owns: ``outcome``. Must not: send anything, or retry.
"""

from __future__ import annotations

from binascii import crc32
from typing import Any

#: Error codes botocore's retry policy never retries, raised at once.
FINAL_CODES = frozenset(
    {
        "ConditionalCheckFailedException",
        "ResourceNotFoundException",
        "ExpiredIteratorException",
        "ValidationException",
        "InvalidArgumentException",
    }
)


def checksum_matches(headers: Any, body: bytes) -> bool:
    """False when DynamoDB's ``x-amz-crc32`` header is there and the body does not match it."""
    expected = headers.get("x-amz-crc32")
    if expected is None:
        return True
    try:
        return crc32(body) & 0xFFFFFFFF == int(expected)
    except ValueError:
        return False


async def outcome(
    client: Any, parser: Any, op: Any, status: int, headers: Any, body: bytes
) -> dict[str, Any] | None:
    """The parsed success, or raises the client's exception for a final error; None for
    anything botocore would retry or that this path does not know."""
    if status >= 500 or not checksum_matches(headers, body):
        return None
    response = {
        "headers": headers,
        "status_code": status,
        "body": body,
        "context": {"operation_name": op.name},
    }
    parsed: dict[str, Any] = await parser.parse(response, op.output_shape)
    if "ResponseMetadata" in parsed:
        parsed["ResponseMetadata"]["RetryAttempts"] = 0
    if status < 300:
        return parsed
    code = parsed.get("Error", {}).get("Code")
    if code not in FINAL_CODES:
        return None
    shape = op.service_model.shape_for_error_code(code)
    if shape is not None:  # the error's modeled fields, as botocore adds them
        parsed.update(await parser.parse(response, shape))
    raise client.exceptions.from_code(code)(parsed, op.name)
