"""Where executors record how far each shard was read in each batch of the Spark source.

Owns: the ``ProgressStore`` contract (get, get a batch, create-if-absent claim, prune) and its
directory implementation ``FileProgressStore`` (``<root>/<run>/<batch>/<shardId>.json``, for a
directory the driver and every executor share), plus ``open_progress_store``, which picks the
directory store when ``metadataPath`` is set and the DynamoDB store
(``kclasync.spark.progress_dynamodb``) otherwise.
Must not: import pyspark or decide anything about batches (``kclasync.spark.offsets`` does).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from typing import Any, Protocol

from kclasync.spark.fetch import AwsOptions
from kclasync.spark.offsets import ShardProgress

__all__ = ["FileProgressStore", "ProgressStore", "open_progress_store"]


class ProgressStore(Protocol):
    """Per-(run, batch, shard) progress records; the first record written for a key wins."""

    async def get(self, run: str, batch: int, shard_id: str) -> ShardProgress | None: ...

    async def get_batch(
        self, run: str, batch: int, shard_ids: list[str]
    ) -> dict[str, ShardProgress]: ...

    async def claim(
        self, run: str, batch: int, shard_id: str, progress: ShardProgress
    ) -> ShardProgress:
        """Record ``progress`` unless a record exists; returns the record that holds."""
        ...

    async def prune(self, run: str, keep_from: int) -> int:
        """Delete the records of batches before ``keep_from``; returns how many went."""
        ...


class FileProgressStore:
    """Progress records as files under a directory every executor reaches at the same path."""

    def __init__(self, root: str) -> None:
        if not root or not os.path.isabs(root):
            raise ValueError(f"the progress directory must be an absolute path, got {root!r}")
        self.root = root

    def _dir(self, run: str, batch: int) -> str:
        return os.path.join(self.root, run, str(batch))

    def _path(self, run: str, batch: int, shard_id: str) -> str:
        return os.path.join(self._dir(run, batch), f"{shard_id}.json")

    def _get(self, run: str, batch: int, shard_id: str) -> ShardProgress | None:
        try:
            with open(self._path(run, batch, shard_id), encoding="utf-8") as f:
                return ShardProgress.from_json(json.load(f))
        except FileNotFoundError:
            return None

    async def get(self, run: str, batch: int, shard_id: str) -> ShardProgress | None:
        return self._get(run, batch, shard_id)

    async def get_batch(
        self, run: str, batch: int, shard_ids: list[str]
    ) -> dict[str, ShardProgress]:
        out = {}
        for shard_id in shard_ids:
            rec = self._get(run, batch, shard_id)
            if rec is not None:
                out[shard_id] = rec
        return out

    async def claim(
        self, run: str, batch: int, shard_id: str, progress: ShardProgress
    ) -> ShardProgress:
        return self._claim(run, batch, shard_id, progress)

    def _claim(self, run: str, batch: int, shard_id: str, progress: ShardProgress) -> ShardProgress:
        """The file is written in full under a temporary name and then hard-linked to its final
        name, which fails if the name exists: readers never see half a record, and of two task
        attempts racing on one shard exactly one wins."""
        directory = self._dir(run, batch)
        os.makedirs(directory, exist_ok=True)
        final = self._path(run, batch, shard_id)
        tmp = os.path.join(directory, f".{shard_id}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(progress.to_json(), f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, final)
        except FileExistsError:
            existing = self._get(run, batch, shard_id)
            assert existing is not None
            return existing
        finally:
            os.unlink(tmp)
        return progress

    async def prune(self, run: str, keep_from: int) -> int:
        run_dir = os.path.join(self.root, run)
        removed = 0
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(run_dir):
                if name.lstrip("-").isdigit() and int(name) < keep_from:
                    path = os.path.join(run_dir, name)
                    removed += len(os.listdir(path))
                    shutil.rmtree(path, ignore_errors=True)
        return removed


async def open_progress_store(
    stack: contextlib.AsyncExitStack,
    aws: AwsOptions,
    metadata_path: str | None,
    table: str,
    session: Any = None,
) -> ProgressStore:
    """The store the options name: a directory (``metadataPath``) or a DynamoDB table whose
    client (made from ``session``, default a new one) is closed with ``stack``."""
    if metadata_path:
        return FileProgressStore(metadata_path)
    from kclasync.spark.progress_dynamodb import DynamoProgressStore

    client = await stack.enter_async_context(
        aws.client_options().create_client("dynamodb", session)
    )
    return DynamoProgressStore(client, table)
