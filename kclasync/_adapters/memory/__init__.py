"""In-memory stand-ins for the lease table and the stream, for tests and deterministic simulation.

Modules: ``faults`` (latency, throttling and transient errors, including errors raised after a
write was applied), ``lease_table`` (``MemoryLeaseTable`` and ``MemoryLeaseStore``, whose write
conditions come from ``_core.lease_rules``; its sibling worker-metrics table is
``_adapters.memory_worker_metrics``), ``stream`` (``MemoryStream``: shards, records,
resharding), ``stream_client`` (``MemoryStreamClient``) and ``coordinator_state`` (the leader
lock items).

Must not: read any clock other than the running event loop's (``loop.time()``), draw randomness
from anything but an injected ``random.Random``, or make protocol decisions (those live in
``kclasync._core``). Same seed plus same call order must give the same run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kclasync._adapters.memory.coordinator_state import MemoryCoordinatorState
from kclasync._adapters.memory.faults import NO_FAULTS, FaultPlan, Latency, OpFaults
from kclasync._adapters.memory.lease_table import MemoryLeaseStore, MemoryLeaseTable
from kclasync._adapters.memory.stream import DEFAULT_EPOCH, MemoryStream, partition_key_hash
from kclasync._adapters.memory.stream_client import (
    DEFAULT_ITERATOR_TTL,
    MEMORY_ACCOUNT_ID,
    MemoryStreamClient,
)

if TYPE_CHECKING:
    from kclasync._adapters.protocols import CoordinatorStateStore, LeaseStore, StreamClient

    def _conforms(
        table: MemoryLeaseTable, client: MemoryStreamClient
    ) -> tuple[LeaseStore, StreamClient]:
        return MemoryLeaseStore(table), client

    def _conforms_lock(state: MemoryCoordinatorState) -> CoordinatorStateStore:
        return state


__all__ = [
    "DEFAULT_EPOCH",
    "DEFAULT_ITERATOR_TTL",
    "MEMORY_ACCOUNT_ID",
    "NO_FAULTS",
    "FaultPlan",
    "Latency",
    "MemoryCoordinatorState",
    "MemoryLeaseStore",
    "MemoryLeaseTable",
    "MemoryStream",
    "MemoryStreamClient",
    "OpFaults",
    "partition_key_hash",
]
