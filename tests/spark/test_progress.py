"""The two progress stores of the Spark source, with the same contract: the first record for a
(run, batch, shard) wins, also between racing writers; reads see it at once; pruning removes
earlier batches only. The DynamoDB store runs against moto's server."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator

import pytest

from kclasync.spark.fetch import AwsOptions
from kclasync.spark.offsets import ShardProgress
from kclasync.spark.progress import FileProgressStore, ProgressStore, open_progress_store
from kclasync.spark.progress_dynamodb import DynamoProgressStore
from kclasync.testing.emulators import LocalAws


def aws_options(local: LocalAws) -> AwsOptions:
    return AwsOptions(
        region_name="us-east-1",
        endpoint_url=local.endpoint_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@contextlib.asynccontextmanager
async def store_of(
    kind: str, moto: LocalAws, tmp_path: pathlib.Path, table: str
) -> AsyncIterator[ProgressStore]:
    async with contextlib.AsyncExitStack() as stack:
        path = str(tmp_path / "progress") if kind == "file" else None
        store = await open_progress_store(stack, aws_options(moto), path, table)
        if isinstance(store, DynamoProgressStore):
            await store.ensure_table()
            await store.ensure_table()  # exists now: a second call is a no-op
        yield store


@pytest.mark.parametrize("kind", ["file", "dynamodb"])
async def test_the_first_progress_record_wins(
    kind: str, moto: LocalAws, tmp_path: pathlib.Path, unique_name: str
) -> None:
    async with store_of(kind, moto, tmp_path, unique_name) as store:
        first = ShardProgress(10, "42", more=True)
        assert await store.get("r", 0, "p") is None
        assert await store.claim("r", 0, "p", first) == first
        assert await store.claim("r", 0, "p", ShardProgress(12, "44")) == first
        assert await store.get("r", 0, "p") == first
        assert await store.get("other-run", 0, "p") is None
        await store.claim("r", 1, "p", ShardProgress(1, "45"))
        await store.claim("r", 1, "q", ShardProgress(0, "TRIM_HORIZON"))
        await store.claim("r", 10, "p", ShardProgress(2, "47"))
        assert await store.get_batch("r", 1, ["p", "q", "x"]) == {
            "p": ShardProgress(1, "45"),
            "q": ShardProgress(0, "TRIM_HORIZON"),
        }
        assert await store.prune("r", 1) == 1
        assert await store.get("r", 0, "p") is None
        assert await store.get("r", 1, "p") is not None
        assert await store.prune("r", 10) == 2
        assert await store.get_batch("r", 1, ["p", "q"]) == {}
        assert await store.get("r", 10, "p") == ShardProgress(2, "47")


@pytest.mark.parametrize("kind", ["file", "dynamodb"])
async def test_of_racing_writers_exactly_one_wins(
    kind: str, moto: LocalAws, tmp_path: pathlib.Path, unique_name: str
) -> None:
    async with store_of(kind, moto, tmp_path, unique_name) as store:
        tries = [ShardProgress(n, str(100 + n)) for n in range(1, 9)]
        held = await asyncio.gather(*(store.claim("r", 3, "s", t) for t in tries))
        assert len(set(held)) == 1
        assert held[0] in tries
        assert await store.get("r", 3, "s") == held[0]


async def test_the_dynamodb_table_is_pay_per_request(moto: LocalAws, unique_name: str) -> None:
    async with (
        aws_options(moto).client_options().create_client("dynamodb") as client,
    ):
        await DynamoProgressStore(client, unique_name).ensure_table()
        table = (await client.describe_table(TableName=unique_name))["Table"]
        assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
        assert [k["AttributeName"] for k in table["KeySchema"]] == ["run", "item"]


def test_the_file_store_refuses_a_relative_path() -> None:
    with pytest.raises(ValueError, match="absolute path"):
        FileProgressStore("progress")
