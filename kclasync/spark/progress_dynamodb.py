"""The Spark source's progress records in a DynamoDB table, so a cluster needs no shared path.

Owns: the table (``run`` hash key, ``item`` range key ``<batch, 12 digits>#<shardId>``,
PAY_PER_REQUEST, created if missing), the create-if-absent ``PutItem`` that makes the first
record for a (run, batch, shard) win, strongly consistent reads, and pruning old batches.
Same semantics as ``FileProgressStore``; each executor task talks to the table directly.
Must not: import pyspark or decide anything about batches.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Final

from botocore.exceptions import ClientError

from kclasync._adapters.call_counts import CallCounts
from kclasync._core.retry_policy import Backoff
from kclasync.spark.offsets import ShardProgress

__all__ = ["DEFAULT_PROGRESS_TABLE", "DynamoProgressStore"]

DEFAULT_PROGRESS_TABLE: Final = "kclasync-spark-progress"

_RUN: Final = "run"
_ITEM: Final = "item"
_BODY: Final = "progress"
_WIDTH: Final = 12
#: Waits between BatchWriteItem calls that left unprocessed items (no jitter: one pruner).
_UNPROCESSED_BACKOFF: Final = Backoff(0.05, 2.0)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _item_key(batch: int, shard_id: str) -> str:
    if batch < 0:
        raise ValueError(f"batch numbers in the progress table start at 0, got {batch}")
    return f"{batch:0{_WIDTH}d}#{shard_id}"


def _batch_prefix(batch: int) -> str:
    return f"{batch:0{_WIDTH}d}#"


class DynamoProgressStore(CallCounts):
    """``ProgressStore`` over a DynamoDB table (a low-level aiobotocore client)."""

    def __init__(self, client: Any, table: str) -> None:
        super().__init__()
        self._client = client
        self.table = table

    async def ensure_table(self, timeout: float = 60.0) -> None:
        """Create the table unless it exists (PAY_PER_REQUEST) and wait until it is ACTIVE."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            self._count("describe_table")
            status = (await self._client.describe_table(TableName=self.table))["Table"][
                "TableStatus"
            ]
        except ClientError as exc:
            if _code(exc) != "ResourceNotFoundException":
                raise
            try:
                self._count("create_table")
                created = await self._client.create_table(
                    TableName=self.table,
                    BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[
                        {"AttributeName": _RUN, "AttributeType": "S"},
                        {"AttributeName": _ITEM, "AttributeType": "S"},
                    ],
                    KeySchema=[
                        {"AttributeName": _RUN, "KeyType": "HASH"},
                        {"AttributeName": _ITEM, "KeyType": "RANGE"},
                    ],
                )
                status = created["TableDescription"]["TableStatus"]
            except ClientError as exc2:
                if _code(exc2) != "ResourceInUseException":
                    raise
                status = "CREATING"  # created by someone else at the same moment
        while status != "ACTIVE":
            if loop.time() > deadline:
                raise TimeoutError(f"progress table {self.table} not ACTIVE after {timeout}s")
            await asyncio.sleep(0.2)
            self._count("describe_table")
            status = (await self._client.describe_table(TableName=self.table))["Table"][
                "TableStatus"
            ]

    async def get(self, run: str, batch: int, shard_id: str) -> ShardProgress | None:
        self._count("get_item")
        resp = await self._client.get_item(
            TableName=self.table,
            Key={_RUN: {"S": run}, _ITEM: {"S": _item_key(batch, shard_id)}},
            ConsistentRead=True,
        )
        item = resp.get("Item")
        return ShardProgress.from_json(json.loads(item[_BODY]["S"])) if item else None

    async def _query(self, **kwargs: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        while True:
            self._count("query")
            resp = await self._client.query(TableName=self.table, ConsistentRead=True, **kwargs)
            items.extend(resp.get("Items", []))
            last = resp.get("LastEvaluatedKey")
            if not last:
                return items
            kwargs["ExclusiveStartKey"] = last

    async def get_batch(
        self, run: str, batch: int, shard_ids: list[str]
    ) -> dict[str, ShardProgress]:
        if not shard_ids:
            return {}
        prefix = _batch_prefix(batch)
        items = await self._query(
            KeyConditionExpression="#r = :run AND begins_with(#i, :prefix)",
            ExpressionAttributeNames={"#r": _RUN, "#i": _ITEM},
            ExpressionAttributeValues={":run": {"S": run}, ":prefix": {"S": prefix}},
        )
        wanted = set(shard_ids)
        out = {}
        for item in items:
            shard_id = item[_ITEM]["S"][len(prefix) :]
            if shard_id in wanted:
                out[shard_id] = ShardProgress.from_json(json.loads(item[_BODY]["S"]))
        return out

    async def claim(
        self, run: str, batch: int, shard_id: str, progress: ShardProgress
    ) -> ShardProgress:
        """A conditional ``PutItem`` (``attribute_not_exists``): of two task attempts racing
        on one shard exactly one wins; the loser reads the winner's record back."""
        try:
            self._count("put_item")
            await self._client.put_item(
                TableName=self.table,
                Item={
                    _RUN: {"S": run},
                    _ITEM: {"S": _item_key(batch, shard_id)},
                    _BODY: {"S": json.dumps(progress.to_json())},
                },
                ConditionExpression="attribute_not_exists(#r)",
                ExpressionAttributeNames={"#r": _RUN},
            )
        except ClientError as exc:
            if _code(exc) != "ConditionalCheckFailedException":
                raise
            existing = await self.get(run, batch, shard_id)
            if existing is None:
                raise RuntimeError(
                    f"progress of {shard_id} in batch {batch} of run {run} exists and vanished"
                ) from exc
            return existing
        return progress

    async def prune(self, run: str, keep_from: int) -> int:
        if keep_from <= 0:
            return 0
        items = await self._query(
            KeyConditionExpression="#r = :run AND #i < :upto",
            ExpressionAttributeNames={"#r": _RUN, "#i": _ITEM},
            ExpressionAttributeValues={
                ":run": {"S": run},
                ":upto": {"S": _batch_prefix(keep_from)},
            },
            ProjectionExpression="#r, #i",
        )
        keys = [{_RUN: item[_RUN], _ITEM: item[_ITEM]} for item in items]
        for i in range(0, len(keys), 25):
            requests: list[dict[str, Any]] = [
                {"DeleteRequest": {"Key": key}} for key in keys[i : i + 25]
            ]
            attempt = 0
            while requests:
                attempt += 1
                self._count("batch_write_item")
                resp = await self._client.batch_write_item(RequestItems={self.table: requests})
                requests = list(resp.get("UnprocessedItems", {}).get(self.table, []))
                if requests:
                    await asyncio.sleep(_UNPROCESSED_BACKOFF.delay(attempt))
        return len(keys)
