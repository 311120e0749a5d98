"""The DynamoDB adapters' shared set-up: one base creates each table from its definition."""

from __future__ import annotations

from pathlib import Path

import pytest

import kclasync
from kclasync._adapters.coordinator_state import DynamoCoordinatorState
from kclasync._adapters.dynamo_table import DynamoTable
from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync._adapters.worker_metrics_table import DynamoWorkerMetrics
from kclasync.testing.emulators import LocalAws

ADAPTERS: list[type[DynamoTable]] = [DynamoLeaseStore, DynamoCoordinatorState, DynamoWorkerMetrics]


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.__name__)
async def test_ensure_table_creates_the_subclass_table_once(
    adapter: type[DynamoTable], moto: LocalAws, unique_name: str
) -> None:
    async with moto.client_options().create_client("dynamodb") as ddb:
        store = adapter(ddb, unique_name)
        await store.ensure_table()
        await store.ensure_table()  # exists: described, not created again
        table = (await ddb.describe_table(TableName=unique_name))["Table"]
    definition = store.table_definition()
    assert table["TableStatus"] == "ACTIVE"
    assert table["KeySchema"] == definition["KeySchema"]
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    indexes = [i["IndexName"] for i in table.get("GlobalSecondaryIndexes", [])]
    assert indexes == [i["IndexName"] for i in definition.get("GlobalSecondaryIndexes", [])]
    assert store.calls["ensure_table"] == 2


def test_calls_are_counted_in_one_place() -> None:
    root = Path(kclasync.__file__).parent
    defined = [
        str(path.relative_to(root))
        for path in sorted(root.rglob("*.py"))
        if "def _count(self, op: str)" in path.read_text()
    ]
    assert defined == ["_adapters/call_counts.py"]
