"""The in-memory coordinator-state table: the leader lock items the workers share.

Owns: ``MemoryCoordinatorState``, with the conditional writes of ``DynamoCoordinatorState``: the
same conditions from ``_core.lease_rules``, evaluated by the lease table's ``holds``.
Must not: decide when a lock has expired (``_core.leader_lock`` does) or a write's condition.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from kclasync._adapters.memory.faults import FaultPlan, with_faults
from kclasync._adapters.memory.lease_table import holds
from kclasync._core.leases import lease_rules as rules
from kclasync._core.leases.client_version import MIGRATION_KEY, MigrationState
from kclasync._core.leases.leader_lock import LockItem

_T = TypeVar("_T")


def _attributes(key: str, item: LockItem | None) -> dict[rules.LockAttr, object] | None:
    """The attributes a stored lock item has for its conditions (None: no item)."""
    if item is None:
        return None
    found: dict[rules.LockAttr, object] = {
        rules.LockAttr.KEY: key,
        rules.LockAttr.RECORD_VERSION: item.record_version,
    }
    if item.owner is not None:
        found[rules.LockAttr.OWNER] = item.owner
    return found


class MemoryCoordinatorState:
    """``CoordinatorStateStore`` over a dict shared by the simulated workers; conditional writes
    as ``DynamoCoordinatorState``'s. Each call is atomic; faults as for ``MemoryLeaseStore``
    (operation names ``get_lock``, ``create_lock``, ``replace_lock``, ``release_lock``)."""

    def __init__(
        self,
        items: dict[str, LockItem] | None = None,
        *,
        faults: FaultPlan | None = None,
        migration: dict[str, MigrationState] | None = None,
        totals: Counter[str] | None = None,
    ) -> None:
        self.items: dict[str, LockItem] = items if items is not None else {}
        #: The ``Migration3.0`` item as a Java KCL 3.x worker would have written it (key
        #: ``MIGRATION_KEY``); empty: no Java 3.x worker ran. Shared like ``items``.
        self.migration: dict[str, MigrationState] = migration if migration is not None else {}
        self.faults = faults
        #: Calls made through this view, by operation.
        self.calls: Counter[str] = Counter()
        #: Calls through every view of the same items, by operation (the fleet's use).
        self.totals: Counter[str] = totals if totals is not None else Counter()

    def shared(self, *, faults: FaultPlan | None = None) -> MemoryCoordinatorState:
        """Another worker's view of the same items."""
        return MemoryCoordinatorState(
            self.items, faults=faults, migration=self.migration, totals=self.totals
        )

    def set_migration_state(self, state: MigrationState | None) -> None:
        """Stand in for a Java KCL 3.x worker's migration state machine (None: no item)."""
        if state is None:
            self.migration.pop(MIGRATION_KEY, None)
        else:
            self.migration[MIGRATION_KEY] = state

    async def _call(self, op: str, apply: Callable[[], _T]) -> _T:
        self.calls[op] += 1
        self.totals[op] += 1
        return await with_faults(self.faults, op, apply)

    async def ensure_table(self) -> None:
        await self._call("ensure_table", lambda: None)

    async def get_migration_state(self) -> MigrationState | None:
        """The item ``set_migration_state`` put there (none unless a test did)."""
        return await self._call("get_migration_state", lambda: self.migration.get(MIGRATION_KEY))

    async def get_lock(self, key: str) -> LockItem | None:
        return await self._call("get_lock", lambda: self.items.get(key))

    async def create_lock(
        self,
        key: str,
        owner: str,
        lease_duration: float,
        version: str,
        successors: tuple[str, ...] | None = None,
    ) -> LockItem | None:
        def apply() -> LockItem | None:
            if not holds(rules.lock_create(), _attributes(key, self.items.get(key))):
                return None
            self.items[key] = LockItem(owner, version, lease_duration, successors=successors)
            return self.items[key]

        return await self._call("create_lock", apply)

    async def replace_lock(
        self,
        key: str,
        expected_version: str,
        owner: str,
        lease_duration: float,
        version: str,
        successors: tuple[str, ...] | None = None,
    ) -> LockItem | None:
        def apply() -> LockItem | None:
            condition = rules.lock_replace(expected_version)
            if not holds(condition, _attributes(key, self.items.get(key))):
                return None
            self.items[key] = LockItem(owner, version, lease_duration, successors=successors)
            return self.items[key]

        return await self._call("replace_lock", apply)

    async def release_lock(self, key: str, expected_version: str, owner: str, version: str) -> bool:
        def apply() -> bool:
            condition = rules.lock_release(expected_version, owner)
            if not holds(condition, _attributes(key, self.items.get(key))):
                return False
            del self.items[key]  # as DynamoCoordinatorState (and the KCL 3.x): delete on release
            return True

        return await self._call("release_lock", apply)
