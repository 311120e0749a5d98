"""The in-memory coordinator-state table: the leader lock items the workers share.

Owns: ``MemoryCoordinatorState``, with the conditional writes of ``DynamoCoordinatorState``.
Must not: decide when a lock has expired (``_core.leader_lock`` does).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from kclasync._adapters.memory.faults import FaultPlan, with_faults
from kclasync._core.client_version import MigrationState
from kclasync._core.leader_lock import LockItem

_T = TypeVar("_T")


class MemoryCoordinatorState:
    """``CoordinatorStateStore`` over a dict shared by the simulated workers; conditional writes
    as ``DynamoCoordinatorState``'s. Each call is atomic; faults as for ``MemoryLeaseStore``
    (operation names ``get_lock``, ``create_lock``, ``replace_lock``, ``release_lock``)."""

    def __init__(
        self,
        items: dict[str, LockItem] | None = None,
        *,
        faults: FaultPlan | None = None,
        totals: Counter[str] | None = None,
    ) -> None:
        self.items: dict[str, LockItem] = items if items is not None else {}
        self.faults = faults
        #: Calls made through this view, by operation.
        self.calls: Counter[str] = Counter()
        #: Calls through every view of the same items, by operation (the fleet's use).
        self.totals: Counter[str] = totals if totals is not None else Counter()

    def shared(self, *, faults: FaultPlan | None = None) -> MemoryCoordinatorState:
        """Another worker's view of the same items."""
        return MemoryCoordinatorState(self.items, faults=faults, totals=self.totals)

    async def _call(self, op: str, apply: Callable[[], _T]) -> _T:
        self.calls[op] += 1
        self.totals[op] += 1
        return await with_faults(self.faults, op, apply)

    async def ensure_table(self) -> None:
        await self._call("ensure_table", lambda: None)

    async def get_migration_state(self) -> MigrationState | None:
        """No Java KCL writes an in-memory table: there is never a ``Migration3.0`` item."""
        return await self._call("get_migration_state", lambda: None)

    async def get_lock(self, key: str) -> LockItem | None:
        return await self._call("get_lock", lambda: self.items.get(key))

    async def create_lock(
        self, key: str, owner: str, lease_duration: float, version: str
    ) -> LockItem | None:
        def apply() -> LockItem | None:
            if key in self.items:
                return None
            self.items[key] = LockItem(owner, version, lease_duration)
            return self.items[key]

        return await self._call("create_lock", apply)

    async def replace_lock(
        self, key: str, expected_version: str, owner: str, lease_duration: float, version: str
    ) -> LockItem | None:
        def apply() -> LockItem | None:
            stored = self.items.get(key)
            if stored is None or stored.record_version != expected_version:
                return None
            self.items[key] = LockItem(owner, version, lease_duration)
            return self.items[key]

        return await self._call("replace_lock", apply)

    async def release_lock(self, key: str, expected_version: str, owner: str, version: str) -> bool:
        def apply() -> bool:
            stored = self.items.get(key)
            if stored is None or stored.record_version != expected_version:
                return False
            if stored.owner != owner:
                return False
            del self.items[key]  # as DynamoCoordinatorState (and the KCL 3.x): delete on release
            return True

        return await self._call("release_lock", apply)
