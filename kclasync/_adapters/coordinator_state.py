"""The ``<app>-CoordinatorState`` table on DynamoDB: the leader lock item.

Owns: the DynamoDB calls behind ``CoordinatorStateStore`` and the lock item's attribute layout,
which is exactly the one of the DynamoDB lock client inside the KCL 3.x, so that a mixed fleet
shares one leader item: HASH key ``key`` (S, ``"Leader"``); ``ownerName`` S; ``leaseDuration`` S
(milliseconds as a decimal string: the lock client parses it from a string); ``recordVersionNumber``
S, replaced on every write; no ``isReleased`` while held; kclasync adds ``kclasyncSuccessors``
(L of S: the workers named to watch the lock fast, ``core.lock_term.successors``), an attribute
the lock client ignores on read and drops when a Java KCL worker writes the item. A graceful
release deletes the item, as the KCL 3.x does. Reading is tolerant: ``leaseDuration`` as S or
N, and the ``isReleased`` forms described in ``core.leader_lock.is_released_marker`` (the lock
client's ``"1"`` and the booleans earlier kclasync versions wrote). Other attributes (the lock
client's ``data``, the KCL's ``Migration3.0`` item in the same table) are left alone.
The conditions of its writes come from ``_core.lease_rules`` (``lock_create``, ``lock_replace``,
``lock_release``), compiled with this table's ``LOCK_SCHEMA``.
Must not: decide anything (when the lock is expired is ``core.leader_lock``'s call, which
condition a write carries is ``core.lease_rules``').

Why a table of its own rather than a typed item in the lease table: every worker scans the lease
table on each taker round, and older Java KCL workers (and our own scan) would read a lock item
as a corrupt lease. A separate table keeps the lease table readable by KCL 2.x and 3.x peers and
matches where the KCL 3.x looks for its leader.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from kclasync._adapters.dynamo_conditions import Schema, compile_write
from kclasync._adapters.dynamo_table import DynamoTable, error_code, mapped_errors
from kclasync._core.leases import lease_rules as rules
from kclasync._core.leases.client_version import (
    MIGRATION_KEY,
    MigrationState,
    decode_migration_item,
)
from kclasync._core.leases.leader_lock import LockItem, is_released_marker

KEY = "key"
OWNER = "ownerName"
LEASE_DURATION = "leaseDuration"
RECORD_VERSION = "recordVersionNumber"
RELEASED = "isReleased"
SUCCESSORS = "kclasyncSuccessors"

_LOCK_ATTRIBUTES = {
    rules.LockAttr.KEY: KEY,
    rules.LockAttr.OWNER: OWNER,
    rules.LockAttr.RECORD_VERSION: RECORD_VERSION,
}

#: How the lock item stores the attributes its conditions read (all strings).
LOCK_SCHEMA = Schema(
    names=lambda attr: (_LOCK_ATTRIBUTES[attr],),
    encode=lambda attr, value: {_LOCK_ATTRIBUTES[attr]: {"S": value}},
)


def coordinator_table_name(lease_table: str) -> str:
    return f"{lease_table}-CoordinatorState"


def _released(item: dict[str, Any]) -> bool:
    attr = item.get(RELEASED)
    if attr is None:
        return False
    value: object = attr["BOOL"] if "BOOL" in attr else next(iter(attr.values()), True)
    return is_released_marker(value)


def _item_to_lock(item: dict[str, Any]) -> LockItem:
    duration = item.get(LEASE_DURATION, {})
    duration_ms = duration.get("S") or duration.get("N")
    try:
        seconds = float(duration_ms or 0) / 1000.0
    except ValueError:
        seconds = 0.0  # unreadable: treated as already expired once its RVN stops changing
    return LockItem(
        owner=item.get(OWNER, {}).get("S"),
        record_version=str(item.get(RECORD_VERSION, {}).get("S", "")),
        lease_duration=seconds,
        released=_released(item),
        successors=_successors(item),
    )


def _successors(item: dict[str, Any]) -> tuple[str, ...] | None:
    """The item's successors; None when absent or not a list of strings (then every kclasync
    worker watches the lock fast, as before the attribute existed)."""
    values = item.get(SUCCESSORS, {}).get("L")
    if not isinstance(values, list):
        return None
    names = [value.get("S") for value in values if isinstance(value, dict)]
    if len(names) != len(values) or not all(isinstance(name, str) for name in names):
        return None
    return tuple(str(name) for name in names)


class DynamoCoordinatorState(DynamoTable):
    """``CoordinatorStateStore`` over a DynamoDB table (low-level aiobotocore client)."""

    def table_definition(self) -> dict[str, Any]:
        return dict(
            AttributeDefinitions=[{"AttributeName": KEY, "AttributeType": "S"}],
            KeySchema=[{"AttributeName": KEY, "KeyType": "HASH"}],
        )

    async def get_lock(self, key: str) -> LockItem | None:
        async with mapped_errors("GetItem"):
            self._count("get_lock")
            resp = await self._client.get_item(
                TableName=self.table_name, Key={KEY: {"S": key}}, ConsistentRead=True
            )
        item = resp.get("Item")
        return None if item is None else _item_to_lock(item)

    async def get_migration_state(self) -> MigrationState | None:
        """The Java KCL's ``Migration3.0`` item, read only (None: absent, or no table yet)."""
        try:
            async with mapped_errors("GetItem"):
                self._count("get_migration_state")
                resp = await self._client.get_item(
                    TableName=self.table_name, Key={KEY: {"S": MIGRATION_KEY}}, ConsistentRead=True
                )
        except ClientError as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return None
            raise
        return decode_migration_item(resp.get("Item"))

    def _item(
        self,
        key: str,
        owner: str,
        lease_duration: float,
        version: str,
        successors: tuple[str, ...] | None,
    ) -> dict[str, Any]:
        item: dict[str, Any] = {
            KEY: {"S": key},
            OWNER: {"S": owner},
            LEASE_DURATION: {"S": str(round(lease_duration * 1000))},
            RECORD_VERSION: {"S": version},
        }
        if successors is not None:
            item[SUCCESSORS] = {"L": [{"S": worker} for worker in successors]}
        return item

    async def _put(self, op: str, item: dict[str, Any], **condition: Any) -> bool:
        try:
            async with mapped_errors("PutItem"):
                self._count(op)
                await self._client.put_item(TableName=self.table_name, Item=item, **condition)
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    async def create_lock(
        self,
        key: str,
        owner: str,
        lease_duration: float,
        version: str,
        successors: tuple[str, ...] | None = None,
    ) -> LockItem | None:
        item = self._item(key, owner, lease_duration, version, successors)
        ok = await self._put(
            "create_lock", item, **compile_write(rules.lock_create(), schema=LOCK_SCHEMA)
        )
        return _item_to_lock(item) if ok else None

    async def replace_lock(
        self,
        key: str,
        expected_version: str,
        owner: str,
        lease_duration: float,
        version: str,
        successors: tuple[str, ...] | None = None,
    ) -> LockItem | None:
        item = self._item(key, owner, lease_duration, version, successors)
        condition = rules.lock_replace(expected_version)
        ok = await self._put("replace_lock", item, **compile_write(condition, schema=LOCK_SCHEMA))
        return _item_to_lock(item) if ok else None

    async def release_lock(self, key: str, expected_version: str, owner: str, version: str) -> bool:
        """Delete the item if we still hold it (``version`` is unused: nothing is left behind)."""
        try:
            async with mapped_errors("DeleteItem"):
                self._count("release_lock")
                await self._client.delete_item(
                    TableName=self.table_name,
                    Key={KEY: {"S": key}},
                    **compile_write(
                        rules.lock_release(expected_version, owner), schema=LOCK_SCHEMA
                    ),
                )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True
