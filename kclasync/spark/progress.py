"""Where executors record how far each shard was read in each batch of the Spark source.

Owns: the ``ProgressStore`` (a directory that the driver and every executor can reach: local disk
in local mode, a shared mount on a cluster), its create-if-absent write, reads and pruning.
Layout: ``<root>/<run>/<batch>/<shardId>.json``.
Must not: import pyspark or decide anything about batches (``kclasync.spark.offsets`` does).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid

from kclasync.spark.offsets import ShardProgress

__all__ = ["ProgressStore"]


class ProgressStore:
    """Per-(run, batch, shard) progress records; the first record written for a key wins."""

    def __init__(self, root: str) -> None:
        if not root:
            raise ValueError("the progress store needs a directory")
        self.root = os.path.abspath(root)

    def _dir(self, run: str, batch: int) -> str:
        return os.path.join(self.root, run, str(batch))

    def _path(self, run: str, batch: int, shard_id: str) -> str:
        return os.path.join(self._dir(run, batch), f"{shard_id}.json")

    def get(self, run: str, batch: int, shard_id: str) -> ShardProgress | None:
        try:
            with open(self._path(run, batch, shard_id), encoding="utf-8") as f:
                return ShardProgress.from_json(json.load(f))
        except FileNotFoundError:
            return None

    def get_batch(self, run: str, batch: int, shard_ids: list[str]) -> dict[str, ShardProgress]:
        out = {}
        for shard_id in shard_ids:
            rec = self.get(run, batch, shard_id)
            if rec is not None:
                out[shard_id] = rec
        return out

    def claim(self, run: str, batch: int, shard_id: str, progress: ShardProgress) -> ShardProgress:
        """Record ``progress`` unless a record exists; returns the record that holds.

        The file is written in full under a temporary name and then hard-linked to its final
        name, which fails if the name exists: readers never see half a record, and of two task
        attempts racing on one shard exactly one wins.
        """
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
            existing = self.get(run, batch, shard_id)
            assert existing is not None
            return existing
        finally:
            os.unlink(tmp)
        return progress

    def prune(self, run: str, keep_from: int) -> None:
        """Delete the records of batches before ``keep_from`` (Spark will not replay them)."""
        run_dir = os.path.join(self.root, run)
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(run_dir):
                if name.lstrip("-").isdigit() and int(name) < keep_from:
                    shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)
