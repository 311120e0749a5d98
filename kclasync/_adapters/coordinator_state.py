"""The ``<app>-CoordinatorState`` table on DynamoDB: the leader lock item.

Owns: the DynamoDB calls behind ``CoordinatorStateStore``. Item layout as the KCL 3.x keeps it
(HASH key ``key``; the DynamoDB lock client's ``ownerName``, ``leaseDuration`` in milliseconds as
a string, ``recordVersionNumber``, ``isReleased``), so a mixed fleet would see one leader item.
Must not: decide anything (when the lock is expired is ``core.leader_lock``'s call).

Why a table of its own rather than a typed item in the lease table: every worker scans the lease
table on each taker round, and older Java KCL workers (and our own scan) would read a lock item
as a corrupt lease. A separate table keeps the lease table readable by KCL 2.x and 3.x peers and
matches where the KCL 3.x looks for its leader.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from kclasync._adapters.dynamodb import _code, _mapped_errors, ensure_table
from kclasync._core.leader_lock import LockItem

KEY = "key"
OWNER = "ownerName"
LEASE_DURATION = "leaseDuration"
RECORD_VERSION = "recordVersionNumber"
RELEASED = "isReleased"


def coordinator_table_name(lease_table: str) -> str:
    return f"{lease_table}-CoordinatorState"


def _item_to_lock(item: dict[str, Any]) -> LockItem:
    duration_ms = item.get(LEASE_DURATION, {}).get("S") or item.get(LEASE_DURATION, {}).get("N")
    return LockItem(
        owner=item.get(OWNER, {}).get("S"),
        record_version=str(item.get(RECORD_VERSION, {}).get("S", "")),
        lease_duration=float(duration_ms or 0) / 1000.0,
        released=bool(item.get(RELEASED, {}).get("BOOL", False)),
    )


class DynamoCoordinatorState:
    """``CoordinatorStateStore`` over a DynamoDB table (low-level aiobotocore client)."""

    def __init__(self, client: Any, table_name: str) -> None:
        self._client = client
        self.table_name = table_name
        self.calls: dict[str, int] = {}

    def _count(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1

    async def ensure_table(self, timeout: float = 60.0) -> None:
        await ensure_table(
            self._client,
            TableName=self.table_name,
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": KEY, "AttributeType": "S"}],
            KeySchema=[{"AttributeName": KEY, "KeyType": "HASH"}],
            timeout=timeout,
        )

    async def get_lock(self, key: str) -> LockItem | None:
        async with _mapped_errors("GetItem"):
            self._count("get_lock")
            resp = await self._client.get_item(
                TableName=self.table_name, Key={KEY: {"S": key}}, ConsistentRead=True
            )
        item = resp.get("Item")
        return None if item is None else _item_to_lock(item)

    def _item(self, key: str, owner: str, lease_duration: float, version: str) -> dict[str, Any]:
        return {
            KEY: {"S": key},
            OWNER: {"S": owner},
            LEASE_DURATION: {"S": str(round(lease_duration * 1000))},
            RECORD_VERSION: {"S": version},
            RELEASED: {"BOOL": False},
        }

    async def _put(self, op: str, item: dict[str, Any], **condition: Any) -> bool:
        try:
            async with _mapped_errors("PutItem"):
                self._count(op)
                await self._client.put_item(TableName=self.table_name, Item=item, **condition)
        except ClientError as exc:
            if _code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    async def create_lock(
        self, key: str, owner: str, lease_duration: float, version: str
    ) -> LockItem | None:
        item = self._item(key, owner, lease_duration, version)
        ok = await self._put(
            "create_lock",
            item,
            ConditionExpression="attribute_not_exists(#k)",
            ExpressionAttributeNames={"#k": KEY},
        )
        return _item_to_lock(item) if ok else None

    async def replace_lock(
        self, key: str, expected_version: str, owner: str, lease_duration: float, version: str
    ) -> LockItem | None:
        item = self._item(key, owner, lease_duration, version)
        ok = await self._put(
            "replace_lock",
            item,
            ConditionExpression="#v = :v",
            ExpressionAttributeNames={"#v": RECORD_VERSION},
            ExpressionAttributeValues={":v": {"S": expected_version}},
        )
        return _item_to_lock(item) if ok else None

    async def release_lock(self, key: str, expected_version: str, owner: str, version: str) -> bool:
        try:
            async with _mapped_errors("UpdateItem"):
                self._count("release_lock")
                await self._client.update_item(
                    TableName=self.table_name,
                    Key={KEY: {"S": key}},
                    UpdateExpression="SET #r = :t, #v = :new",
                    ConditionExpression="#v = :old AND #o = :owner",
                    ExpressionAttributeNames={"#r": RELEASED, "#v": RECORD_VERSION, "#o": OWNER},
                    ExpressionAttributeValues={
                        ":t": {"BOOL": True},
                        ":new": {"S": version},
                        ":old": {"S": expected_version},
                        ":owner": {"S": owner},
                    },
                )
        except ClientError as exc:
            if _code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True
