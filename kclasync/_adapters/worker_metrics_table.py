"""The ``<app>-WorkerMetricStats`` table on DynamoDB, shared with Java KCL 3.x workers, and the
one-time removal of earlier kclasync registry items from the lease table.

Owns: the DynamoDB calls behind ``WorkerRegistry``: creating the table as the KCL does (HASH
``wid`` S, PAY_PER_REQUEST), writing an entry with UpdateItem (``lut``, ``sts``, ``opr`` and
kclasync's ``impl`` marker only, so attributes a newer KCL adds, such as ``sup``/``slu``,
survive), a strongly consistent paged scan, and deleting an entry.
Item layout: ``core.worker_metrics``.
Must not: decide anything (liveness, validity and the migration's key selection are the core's).
"""

from __future__ import annotations

import logging
from typing import Any

from botocore.exceptions import ClientError

from kclasync._adapters import lease_codec as c
from kclasync._adapters.dynamo_conditions import compile_lease_write
from kclasync._adapters.dynamo_table import DynamoTable, error_code, mapped_errors
from kclasync._core.leases import lease_rules as rules
from kclasync._core.workers import worker_metrics as wm
from kclasync._core.workers import worker_metrics_item as wi

log = logging.getLogger("kclasync.registry")


class DynamoWorkerMetrics(DynamoTable):
    """``WorkerRegistry`` over a DynamoDB table (low-level aiobotocore client)."""

    def __init__(self, client: Any, table_name: str) -> None:
        super().__init__(client, table_name)
        #: Unreadable items met by ``list_workers`` so far.
        self.corrupt_seen = 0

    def table_definition(self) -> dict[str, Any]:
        return dict(
            AttributeDefinitions=[{"AttributeName": wi.WORKER_ID, "AttributeType": "S"}],
            KeySchema=[{"AttributeName": wi.WORKER_ID, "KeyType": "HASH"}],
        )

    async def report(self, metrics: wm.WorkerMetrics) -> None:
        item = wi.encode_item(metrics)
        fields = [wi.LAST_UPDATE, wi.METRIC_STATS, wi.OPERATING_RANGE]
        if wi.IMPLEMENTATION in item:
            fields.append(wi.IMPLEMENTATION)
        fields.extend(f for f in wi.REPLACED_OR_REMOVED if f in item)
        names = {f"#a{i}": f for i, f in enumerate(fields)}
        values = {f":a{i}": item[f] for i, f in enumerate(fields)}
        update = "SET " + ", ".join(f"#a{i} = :a{i}" for i in range(len(fields)))
        # A capacity, heartbeat period or digest from an earlier report no longer holds.
        stale = [f for f in wi.REPLACED_OR_REMOVED if f not in item]
        if stale:
            names.update({f"#r{i}": f for i, f in enumerate(stale)})
            update += " REMOVE " + ", ".join(f"#r{i}" for i in range(len(stale)))
        async with mapped_errors("UpdateItem"):
            self._count("report")
            await self._client.update_item(
                TableName=self.table_name,
                Key={wi.WORKER_ID: item[wi.WORKER_ID]},
                UpdateExpression=update,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )

    async def list_workers(self) -> wi.DecodedEntries:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"TableName": self.table_name, "ConsistentRead": True}
        while True:
            async with mapped_errors("Scan"):
                self._count("list_workers")
                resp = await self._client.scan(**kwargs)
            items.extend(resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                break
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        decoded = wi.decode_items(items)  # the caller logs the unreadable ones (once each)
        self.corrupt_seen += len(decoded.corrupt)
        return decoded

    async def get(self, worker_id: str) -> wm.WorkerMetrics | None:
        """One entry, read strongly (None: no such entry). Raises CorruptWorkerMetricsError
        for an unreadable one."""
        async with mapped_errors("GetItem"):
            self._count("get")
            resp = await self._client.get_item(
                TableName=self.table_name,
                Key={wi.WORKER_ID: {"S": worker_id}},
                ConsistentRead=True,
            )
        item = resp.get("Item")
        return None if item is None else wi.decode_item(item)

    async def remove(self, worker_id: str, *, heartbeat: int | None = None) -> bool:
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": {wi.WORKER_ID: {"S": worker_id}},
        }
        if heartbeat is not None:
            kwargs["ConditionExpression"] = "#hb = :hb"
            kwargs["ExpressionAttributeNames"] = {"#hb": wi.HEARTBEAT}
            kwargs["ExpressionAttributeValues"] = {":hb": {"N": str(heartbeat)}}
        try:
            async with mapped_errors("DeleteItem"):
                self._count("remove")
                await self._client.delete_item(**kwargs)
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            return False
        return True


async def remove_legacy_registry_items(client: Any, lease_table: str) -> list[str]:
    """Delete the ``__worker__:`` items earlier kclasync versions kept in the lease table (the
    Java KCL fails on them). Each delete is conditional on the item still not being a lease
    (no ``leaseCounter``). Returns the keys deleted; logs each. Safe to run on every start."""
    keys: list[str] = []
    kwargs: dict[str, Any] = {
        "TableName": lease_table,
        "ConsistentRead": True,
        "ProjectionExpression": "#k",
        "FilterExpression": "begins_with(#k, :p)",
        "ExpressionAttributeNames": {"#k": c.LEASE_KEY},
        "ExpressionAttributeValues": {":p": {"S": wm.LEGACY_WORKER_KEY_PREFIX}},
    }
    while True:
        async with mapped_errors("Scan"):
            resp = await client.scan(**kwargs)
        keys.extend(i[c.LEASE_KEY]["S"] for i in resp.get("Items", []) if c.LEASE_KEY in i)
        if "LastEvaluatedKey" not in resp:
            break
        kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
    removed: list[str] = []
    for key in wm.legacy_registry_keys(keys):
        try:
            async with mapped_errors("DeleteItem"):
                await client.delete_item(
                    TableName=lease_table,
                    Key={c.LEASE_KEY: {"S": key}},
                    **compile_lease_write(rules.delete_registry_item()),
                )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            continue
        log.info("removed the earlier worker-registry item %s from %s", key, lease_table)
        removed.append(key)
    return removed
