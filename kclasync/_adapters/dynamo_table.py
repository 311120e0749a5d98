"""What every DynamoDB adapter shares: the table set-up and the mapping of AWS errors.

Owns: ``DynamoTable``, the base of the adapters over one DynamoDB table (the lease table, the
coordinator-state table, the worker-metrics table): the low-level aiobotocore client, the table
name, the call counts and ``ensure_table`` from the subclass's ``table_definition``; the
create-unless-exists-and-wait of a table (``ensure_table``); and the mapping of DynamoDB's
throttling and transient errors to the adapter errors (``mapped_errors``, ``error_code``).
Must not: know any table's attributes beyond what a subclass's definition gives, or decide
anything about the protocol.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from kclasync._adapters.call_counts import CallCounts
from kclasync.errors import ThrottledError, TransientError

_THROTTLING = {
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "LimitExceededException",
}
_TRANSIENT = {"InternalServerError", "ServiceUnavailable", "InternalFailure"}


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


@contextlib.asynccontextmanager
async def mapped_errors(operation: str) -> AsyncIterator[None]:
    """Raise throttling as ``ThrottledError`` and server or connection failures as
    ``TransientError``; other client errors (a failed condition) pass unchanged."""
    try:
        yield
    except ClientError as exc:
        code = error_code(exc)
        if code in _THROTTLING:
            raise ThrottledError(f"DynamoDB {operation} throttled: {code}") from exc
        if code in _TRANSIENT:
            raise TransientError(f"DynamoDB {operation} failed: {code}") from exc
        raise
    except (TimeoutError, BotoCoreError, OSError) as exc:
        raise TransientError(f"DynamoDB {operation} failed: {exc}") from exc


async def ensure_table(client: Any, *, timeout: float = 60.0, **create: Any) -> None:
    """Create a table (``create`` = CreateTable's arguments) unless it exists, then wait until
    it is ACTIVE. A table another worker is creating at the same moment is waited for."""
    name = create["TableName"]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        async with mapped_errors("DescribeTable"):
            status = (await client.describe_table(TableName=name))["Table"]["TableStatus"]
    except ClientError as exc:
        if error_code(exc) != "ResourceNotFoundException":
            raise
        try:
            async with mapped_errors("CreateTable"):
                status = (await client.create_table(**create))["TableDescription"]["TableStatus"]
        except ClientError as exc2:
            if error_code(exc2) != "ResourceInUseException":
                raise
            status = "CREATING"
    while status != "ACTIVE":
        if loop.time() > deadline:
            raise TransientError(f"table {name} not ACTIVE after {timeout}s")
        await asyncio.sleep(0.2)
        async with mapped_errors("DescribeTable"):
            status = (await client.describe_table(TableName=name))["Table"]["TableStatus"]


class DynamoTable(CallCounts, abc.ABC):
    """An adapter over one DynamoDB table, through a low-level aiobotocore DynamoDB client.

    A subclass gives its key schema (``table_definition``); ``ensure_table`` creates the table
    with it (PAY_PER_REQUEST) unless it exists.
    """

    def __init__(self, client: Any, table_name: str) -> None:
        super().__init__()
        self._client = client
        self.table_name = table_name

    @abc.abstractmethod
    def table_definition(self) -> dict[str, Any]:
        """CreateTable's schema arguments: ``AttributeDefinitions``, ``KeySchema`` and any
        ``GlobalSecondaryIndexes``."""

    async def ensure_table(self, timeout: float = 60.0) -> None:
        self._count("ensure_table")
        await ensure_table(
            self._client,
            TableName=self.table_name,
            BillingMode="PAY_PER_REQUEST",
            timeout=timeout,
            **self.table_definition(),
        )


__all__ = ["DynamoTable", "ensure_table", "error_code", "mapped_errors"]
