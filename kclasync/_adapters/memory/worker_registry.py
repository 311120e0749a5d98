"""The worker registry of the in-memory lease table: one heartbeat counter per live worker.

Owns: ``MemoryWorkerRegistry`` (the entries) and ``WorkerRegistryWrites`` (the
``heartbeat_worker`` / ``remove_worker`` calls of ``MemoryLeaseStore``). Kept apart from the
lease writes so the registry can move to a table of its own without touching them.
Must not: judge liveness (readers do, from heartbeat changes on their own clock) or touch leases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from kclasync._adapters.protocols import WorkerHeartbeat

_T = TypeVar("_T")


class MemoryWorkerRegistry:
    """Registry entries: worker id -> heartbeat counter."""

    def __init__(self) -> None:
        self.heartbeats: dict[str, int] = {}

    def beat(self, worker_id: str) -> None:
        self.heartbeats[worker_id] = self.heartbeats.get(worker_id, 0) + 1

    def remove(self, worker_id: str) -> None:
        self.heartbeats.pop(worker_id, None)

    def entries(self) -> tuple[WorkerHeartbeat, ...]:
        """Every entry, ordered by worker id, as a scan returns them."""
        return tuple(WorkerHeartbeat(w, beat) for w, beat in sorted(self.heartbeats.items()))


class WorkerRegistryWrites:
    """The registry calls of a store: each goes through the store's ``_write`` (counting and
    faults) under the operation names ``heartbeat_worker`` and ``remove_worker``."""

    def _registry(self) -> MemoryWorkerRegistry:
        raise NotImplementedError

    async def _write(self, op: str, apply: Callable[[], _T]) -> _T:
        raise NotImplementedError

    async def heartbeat_worker(self, worker_id: str) -> None:
        registry = self._registry()
        await self._write("heartbeat_worker", lambda: registry.beat(worker_id))

    async def remove_worker(self, worker_id: str) -> None:
        registry = self._registry()
        await self._write("remove_worker", lambda: registry.remove(worker_id))


__all__ = ["MemoryWorkerRegistry", "WorkerRegistryWrites"]
