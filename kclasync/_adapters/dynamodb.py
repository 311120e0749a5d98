"""The lease table on DynamoDB (aiobotocore), with the KCL's fenced conditional writes.

Owns: the DynamoDB calls behind ``LeaseStore`` (the table's set-up and the mapping of AWS errors
are ``dynamo_table``'s). Each write (its condition and its update) comes from
``_core.lease_rules``, compiled by ``dynamo_conditions``; attribute names come from
``lease_codec``.
Must not: decide anything about the protocol (which lease to take, when it expires, which
condition a write carries or what it changes).
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from kclasync._adapters import lease_codec as c
from kclasync._adapters.dynamo_conditions import compile_lease_write
from kclasync._adapters.dynamo_table import DynamoTable, error_code, mapped_errors
from kclasync._adapters.protocols import LeaseScan
from kclasync._core.leases import lease_rules as rules
from kclasync._core.leases.lease import CorruptLeaseError, Lease
from kclasync._core.leases.position import Checkpoint


class DynamoLeaseStore(DynamoTable):
    """``LeaseStore`` over a DynamoDB table, using a low-level aiobotocore DynamoDB client."""

    # -- table -----------------------------------------------------------------------------

    def table_definition(self) -> dict[str, Any]:
        return dict(
            AttributeDefinitions=[
                {"AttributeName": c.LEASE_KEY, "AttributeType": "S"},
                {"AttributeName": c.LEASE_OWNER, "AttributeType": "S"},
            ],
            KeySchema=[{"AttributeName": c.LEASE_KEY, "KeyType": "HASH"}],
            GlobalSecondaryIndexes=[
                {
                    "IndexName": c.OWNER_INDEX,
                    "KeySchema": [
                        {"AttributeName": c.LEASE_OWNER, "KeyType": "HASH"},
                        {"AttributeName": c.LEASE_KEY, "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                }
            ],
        )

    # -- reads -----------------------------------------------------------------------------

    async def is_empty(self) -> bool:
        async with mapped_errors("Scan"):
            self._count("scan")
            resp = await self._client.scan(
                TableName=self.table_name, Limit=1, ConsistentRead=True, Select="COUNT"
            )
        return int(resp.get("Count", 0)) == 0 and "LastEvaluatedKey" not in resp

    async def list_leases(self) -> LeaseScan:
        leases: list[Lease] = []
        corrupt: list[CorruptLeaseError] = []
        kwargs: dict[str, Any] = {"TableName": self.table_name, "ConsistentRead": True}
        while True:
            async with mapped_errors("Scan"):
                self._count("scan")
                resp = await self._client.scan(**kwargs)
            for item in resp.get("Items", []):
                if not c.is_lease_item(item):
                    continue
                try:
                    leases.append(c.item_to_lease(item))
                except CorruptLeaseError as exc:
                    corrupt.append(exc)
            last = resp.get("LastEvaluatedKey")
            if not last:
                return LeaseScan(tuple(leases), tuple(corrupt))
            kwargs["ExclusiveStartKey"] = last

    async def lease_keys_of(self, owner: str) -> tuple[str, ...]:
        keys: list[str] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "IndexName": c.OWNER_INDEX,
            "KeyConditionExpression": "#o = :o",
            "ExpressionAttributeNames": {"#o": c.LEASE_OWNER},
            "ExpressionAttributeValues": {":o": {"S": owner}},
        }
        while True:
            async with mapped_errors("Query"):
                self._count("query")
                resp = await self._client.query(**kwargs)
            keys.extend(item[c.LEASE_KEY]["S"] for item in resp.get("Items", []))
            last = resp.get("LastEvaluatedKey")
            if not last:
                return tuple(sorted(keys))
            kwargs["ExclusiveStartKey"] = last

    async def get_lease(self, key: str) -> Lease | None:
        async with mapped_errors("GetItem"):
            self._count("get_item")
            resp = await self._client.get_item(
                TableName=self.table_name, Key={c.LEASE_KEY: {"S": key}}, ConsistentRead=True
            )
        item = resp.get("Item")
        return None if item is None else c.item_to_lease(item)

    # -- conditional writes ----------------------------------------------------------------

    async def _update(self, op: str, key: str, write: rules.Write) -> Lease | None:
        params = {
            "TableName": self.table_name,
            "Key": {c.LEASE_KEY: {"S": key}},
            "ReturnValues": "ALL_NEW",
            **compile_lease_write(write),
        }
        try:
            async with mapped_errors(op):
                self._count(op)
                resp = await self._client.update_item(**params)
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return None
            raise
        return c.item_to_lease(resp["Attributes"])

    async def create_lease(self, lease: Lease) -> bool:
        try:
            async with mapped_errors("PutItem"):
                self._count("create")
                await self._client.put_item(
                    TableName=self.table_name,
                    Item=c.lease_to_item(lease),
                    **compile_lease_write(rules.create()),
                )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    async def renew_lease(self, lease: Lease, throughput_kbps: float | None = None) -> Lease | None:
        return await self._update("renew", lease.key, rules.renew(lease, throughput_kbps))

    async def take_lease(self, lease: Lease, owner: str) -> Lease | None:
        return await self._update("take", lease.key, rules.take(lease, owner))

    async def release_lease(self, lease: Lease) -> Lease | None:
        return await self._update("release", lease.key, rules.release(lease))

    async def checkpoint(
        self, lease: Lease, checkpoint: Checkpoint, pending: Checkpoint | None = None
    ) -> Lease | None:
        return await self._update(
            "checkpoint", lease.key, rules.checkpoint(lease, checkpoint, pending)
        )

    async def start_handoff(self, lease: Lease, new_owner: str) -> Lease | None:
        return await self._update("start_handoff", lease.key, rules.start_handoff(lease, new_owner))

    async def finish_handoff(self, lease: Lease) -> Lease | None:
        return await self._update("finish_handoff", lease.key, rules.finish_handoff(lease))

    async def delete_lease(self, lease: Lease) -> bool:
        try:
            async with mapped_errors("DeleteItem"):
                self._count("delete")
                await self._client.delete_item(
                    TableName=self.table_name,
                    Key={c.LEASE_KEY: {"S": lease.key}},
                    **compile_lease_write(rules.delete(lease)),
                )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    async def update_child_shard_ids(
        self, lease: Lease, child_shard_ids: frozenset[str]
    ) -> Lease | None:
        write = rules.update_child_shard_ids(lease, child_shard_ids)
        return await self._update("child_shards", lease.key, write)

    # -- administration (CLI) --------------------------------------------------------------

    async def set_sticky(self, key: str, value: int | None, worker: str | None = None) -> None:
        """Set ``Sticky`` (and ``stickyWorker``), or remove both with ``value=None``.

        Administration only: workers never write these attributes. Raises ``KeyError`` for a
        lease that does not exist.
        """
        try:
            async with mapped_errors("UpdateItem"):
                self._count("set_sticky")
                await self._client.update_item(
                    TableName=self.table_name,
                    Key={c.LEASE_KEY: {"S": key}},
                    **compile_lease_write(rules.set_sticky(value, worker)),
                )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                raise KeyError(f"no lease {key!r} in table {self.table_name}") from None
            raise
