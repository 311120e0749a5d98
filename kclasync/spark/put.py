"""Writing records to a Kinesis stream with PutRecords, for the Spark sink.

Owns: checking each entry against the API's limits (partition key 1-256 characters, at most
1 MiB of data + key per record), packing entries into requests (at most 500 records and 5 MiB),
sending them, and retrying with backoff what failed: a whole request that was throttled or
failed transiently, and every entry a response lists with an ``ErrorCode``
(``FailedRecordCount``), until it is written or the attempts are used up. Counts what it did.
Must not: import pyspark. Delivery is at-least-once: an entry may be written again when a
response is lost or Spark retries the task.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Iterator
from typing import Any, Final

import attrs
from botocore.exceptions import BotoCoreError, ClientError

from kclasync._core.retry_policy import Backoff, Jitter
from kclasync.errors import KclAsyncError

__all__ = [
    "MAX_RECORD_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_REQUEST_RECORDS",
    "Entry",
    "PutFailedError",
    "PutStats",
    "RecordTooLargeError",
    "pack",
    "put_all",
]

MAX_REQUEST_RECORDS: Final = 500
MAX_REQUEST_BYTES: Final = 5 * 1024 * 1024
MAX_RECORD_BYTES: Final = 1024 * 1024
MAX_KEY_CHARS: Final = 256

_RETRYABLE: Final = {
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "LimitExceededException",
    "KMSThrottlingException",
    "InternalFailure",
    "ServiceUnavailable",
    "InternalServerError",
}


class RecordTooLargeError(KclAsyncError, ValueError):
    """A record breaks PutRecords' per-record limits; it cannot be written as it is."""


class PutFailedError(KclAsyncError):
    """Entries were still failing after every attempt."""


@attrs.frozen
class Entry:
    """One record to put. ``size`` counts what Kinesis counts: data plus partition key."""

    partition_key: str
    data: bytes
    explicit_hash_key: str | None = None

    @property
    def size(self) -> int:
        return len(self.data) + len(self.partition_key.encode())

    def check(self, row: int) -> Entry:
        if not self.partition_key or len(self.partition_key) > MAX_KEY_CHARS:
            raise RecordTooLargeError(
                f"row {row}: the partition key must have 1 to {MAX_KEY_CHARS} characters, "
                f"got {len(self.partition_key)}"
            )
        if self.size > MAX_RECORD_BYTES:
            raise RecordTooLargeError(
                f"row {row} (partition key {self.partition_key!r}) is {self.size:,} bytes of "
                f"data and key; a Kinesis record holds at most {MAX_RECORD_BYTES:,}"
            )
        if self.explicit_hash_key is not None and not (
            self.explicit_hash_key.isdigit() and int(self.explicit_hash_key) < 1 << 128
        ):
            raise RecordTooLargeError(
                f"row {row}: the explicit hash key must be a decimal below 2^128, got "
                f"{self.explicit_hash_key!r}"
            )
        return self

    def request(self) -> dict[str, Any]:
        out: dict[str, Any] = {"PartitionKey": self.partition_key, "Data": self.data}
        if self.explicit_hash_key is not None:
            out["ExplicitHashKey"] = self.explicit_hash_key
        return out


@attrs.define
class PutStats:
    """What a writer did (summed over tasks on the driver)."""

    records: int = 0
    bytes: int = 0
    requests: int = 0
    retried_records: int = 0
    throttled_requests: int = 0

    def add(self, other: PutStats) -> None:
        self.records += other.records
        self.bytes += other.bytes
        self.requests += other.requests
        self.retried_records += other.retried_records
        self.throttled_requests += other.throttled_requests


def pack(
    entries: Iterable[Entry],
    *,
    max_records: int = MAX_REQUEST_RECORDS,
    max_bytes: int = MAX_REQUEST_BYTES,
) -> Iterator[list[Entry]]:
    """Entries in order, grouped into requests within the record and byte limits. Each entry
    must already pass ``Entry.check``."""
    chunk: list[Entry] = []
    size = 0
    for entry in entries:
        if chunk and (len(chunk) >= max_records or size + entry.size > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += entry.size
    if chunk:
        yield chunk


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


async def _put_chunk(
    client: Any,
    stream: str,
    chunk: list[Entry],
    stats: PutStats,
    *,
    attempts: int,
    backoff: Backoff,
    rng: random.Random,
) -> None:
    pending = chunk
    codes: set[str] = set()
    for attempt in range(1, attempts + 1):
        try:
            stats.requests += 1
            resp = await client.put_records(
                StreamName=stream, Records=[e.request() for e in pending]
            )
        except ClientError as exc:
            if _code(exc) not in _RETRYABLE or attempt == attempts:
                raise
            stats.throttled_requests += 1
        except (BotoCoreError, OSError, TimeoutError):
            if attempt == attempts:
                raise
        else:
            results = resp.get("Records", [])
            if not resp.get("FailedRecordCount"):
                failed: list[Entry] = []
            else:
                pairs = list(zip(pending, results, strict=True))
                failed = [e for e, r in pairs if r.get("ErrorCode")]
                codes = {str(r["ErrorCode"]) for _, r in pairs if r.get("ErrorCode")}
            written = len(pending) - len(failed)
            stats.records += written
            stats.bytes += sum(e.size for e in pending) - sum(e.size for e in failed)
            if not failed:
                return
            stats.retried_records += len(failed)
            pending = failed
            if attempt == attempts:
                break
        await asyncio.sleep(backoff.delay(attempt, rng.random()))
    raise PutFailedError(
        f"{len(pending)} records to {stream} still failed after {attempts} attempts "
        f"({', '.join(sorted(codes))})"
    )


async def put_all(
    client: Any,
    stream: str,
    entries: Iterable[Entry],
    *,
    max_records: int = MAX_REQUEST_RECORDS,
    attempts: int = 10,
    backoff: float = 0.1,
    max_backoff: float = 5.0,
    rng: random.Random | None = None,
) -> PutStats:
    """Put every entry; returns the counts. Raises ``RecordTooLargeError`` for an entry that
    breaks the per-record limits (before anything after it is sent) and ``PutFailedError``
    when entries keep failing. The waits (``retry_policy.Backoff``, half jitter drawn from
    ``rng``) start at ``backoff`` and double up to ``max_backoff``."""
    stats = PutStats()
    waits = Backoff(backoff, max_backoff, Jitter.HALF)
    draws = rng if rng is not None else random.Random()

    def checked() -> Iterator[Entry]:
        for row, entry in enumerate(entries):
            yield entry.check(row)

    for chunk in pack(checked(), max_records=max_records):
        await _put_chunk(
            client,
            stream,
            chunk,
            stats,
            attempts=attempts,
            backoff=waits,
            rng=draws,
        )
    return stats
