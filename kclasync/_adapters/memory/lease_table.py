"""The in-memory lease table and the ``LeaseStore`` over it.

Owns: ``MemoryLeaseTable`` (the shared table state and its call counters) and ``MemoryLeaseStore``
(its reads and conditional writes). Each write (condition and update) comes from
``_core.lease_rules``: its condition is evaluated here by ``holds`` and its update applied by
``apply_update``, as DynamoDB would, so no write is written out here.
Must not: decide a write's condition or what it changes, read any clock but the loop's, or keep
worker-registry entries among the leases (the registry is the sibling ``MemoryWorkerMetrics``
table).
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from kclasync._adapters.memory.faults import FaultPlan, with_faults
from kclasync._adapters.memory_worker_metrics import MemoryWorkerMetrics
from kclasync._adapters.protocols import (
    LeaseScan,
)
from kclasync._core.leases import lease_rules as rules
from kclasync._core.leases.lease import CorruptLeaseError, Lease
from kclasync._core.leases.position import Checkpoint

_T = TypeVar("_T")


def holds(condition: rules.Condition, item: Mapping[Any, object] | None) -> bool:
    """Whether a stored item (its attributes by rules attribute; None: no item) meets a write
    condition, as DynamoDB judges it."""
    found: Mapping[Any, object] = item or {}
    if isinstance(condition, rules.All):
        return all(holds(term, item) for term in condition.terms)
    if isinstance(condition, rules.Exists):
        return condition.attr in found
    if isinstance(condition, rules.Missing):
        return condition.attr not in found
    return condition.attr in found and found[condition.attr] == condition.value


def _allows(condition: rules.Condition, stored: Lease | None) -> bool:
    """``holds`` on the item ``stored`` would be (``rules.attributes``), read from the lease
    field by field: only the attributes the condition names are looked at."""
    if stored is None:
        return holds(condition, None)
    if isinstance(condition, rules.All):
        return all(_allows(term, stored) for term in condition.terms)
    value = getattr(stored, condition.attr.value)
    present = value is not None and value != frozenset()
    if isinstance(condition, rules.Exists):
        return present
    if isinstance(condition, rules.Missing):
        return not present
    return present and value == condition.value


def _removed(field: str) -> object:
    """The value a ``Lease`` field has when its attribute is absent (its default)."""
    default = attrs.fields_dict(Lease)[field].default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        raise ValueError(f"lease field {field} cannot be removed")
    return default


#: ``Lease``'s fields in the order of its initializer, and a getter of all of them at once.
_FIELDS = {name: index for index, name in enumerate(attrs.fields_dict(Lease))}
_ALL_FIELDS = operator.attrgetter(*_FIELDS)


def apply_update(update: tuple[rules.Action, ...], stored: Lease) -> Lease:
    """The lease once a write's update is applied, as DynamoDB applies it to the item: every
    action reads the item as it was before the write. (What ``attrs.evolve`` would build,
    built from the stored values positionally: one of these per lease write.)"""
    values = list(_ALL_FIELDS(stored))
    value: Any
    for action in update:
        field = action.attr.value
        if isinstance(action, rules.Set):
            value = action.value
        elif isinstance(action, rules.Remove):
            value = _removed(field)
        else:
            value = (getattr(stored, field) or 0) + action.amount
        values[_FIELDS[field]] = value
    return type(stored)(*values)


class LeaseItems(dict[str, Lease]):
    """The table's leases by key, with an index of the keys each owner holds.

    A plain dict for reading; every way of changing it keeps ``owned`` (owner -> keys) in step,
    so ``lease_keys_of`` reads one owner's keys instead of scanning the table (as the owner
    index on DynamoDB does). Tests may assign items directly: the index follows.
    """

    def __init__(self) -> None:
        super().__init__()
        self.owned: dict[str | None, set[str]] = {}

    def _unindex(self, key: str, lease: Lease | None = None) -> None:
        old = dict.get(self, key) if lease is None else lease
        if old is not None:
            keys = self.owned[old.owner]
            keys.discard(key)
            if not keys:
                del self.owned[old.owner]

    def __setitem__(self, key: str, lease: Lease) -> None:
        self._unindex(key)
        super().__setitem__(key, lease)
        self.owned.setdefault(lease.owner, set()).add(key)

    def __delitem__(self, key: str) -> None:
        self._unindex(key)
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self._unindex(key)
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, Lease]:
        key, lease = super().popitem()
        self._unindex(key, lease)
        return key, lease

    def setdefault(self, key: str, default: Lease) -> Lease:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Lease) -> None:
        for key, lease in dict(*args, **kwargs).items():
            self[key] = lease

    def __ior__(self, other: Any) -> LeaseItems:  # type: ignore[override, misc]
        self.update(other)
        return self

    def clear(self) -> None:
        super().clear()
        self.owned.clear()

    def __reduce__(self) -> tuple[Any, ...]:
        """Copies and pickles rebuild the index from the items."""
        return (_lease_items, (dict(self),))

    def keys_of(self, owner: str) -> list[str]:
        """The keys of the leases ``owner`` holds, sorted."""
        return sorted(self.owned.get(owner, ()))


def _lease_items(items: dict[str, Lease]) -> LeaseItems:
    rebuilt = LeaseItems()
    rebuilt.update(items)
    return rebuilt


class MemoryLeaseTable:
    """The shared lease-table state: leases by key, unreadable items, and call counters.

    Several ``MemoryLeaseStore`` instances (one per simulated worker) share one table. Counters
    count calls that reached the table (not those failed by injected faults before the write);
    a conditional write whose condition failed still counts as a write, as it costs a write in
    DynamoDB, and is also counted in ``condition_failures``.
    """

    def __init__(self) -> None:
        self.leases = LeaseItems()
        self.corrupt: dict[str, CorruptLeaseError] = {}
        self.exists = False
        self.reads: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()
        self.condition_failures: Counter[str] = Counter()
        #: Items returned by full scans (a scan costs capacity per item).
        self.items_scanned = 0
        #: Items returned, by read operation (``list_leases``: the table; ``lease_keys_of``: the
        #: owner index), for capacity estimates.
        self.items_read: Counter[str] = Counter()
        #: The application's ``<app>-WorkerMetricStats`` table, beside this one (not in it).
        self.worker_metrics = MemoryWorkerMetrics()

    @property
    def workers(self) -> dict[str, dict[str, object]]:
        """Worker registry entries (worker id -> item) of the sibling worker-metrics table."""
        return self.worker_metrics.items

    def get(self, key: str) -> Lease | None:
        """The stored lease (no counting, no faults): for assertions and reports."""
        return self.leases.get(key)

    def snapshot(self) -> dict[str, Lease]:
        return dict(self.leases)


class MemoryLeaseStore:
    """``LeaseStore`` over a ``MemoryLeaseTable``, with the KCL's fenced conditional writes.

    Each call is atomic: the condition (from ``_core.lease_rules``) is checked and the write
    applied without yielding to the event loop. Injected latency is awaited before that point.
    """

    def __init__(self, table: MemoryLeaseTable, *, faults: FaultPlan | None = None) -> None:
        self.table = table
        self.faults = faults
        #: Calls made through this store, by operation (per worker, like DynamoLeaseStore.calls).
        self.calls: Counter[str] = Counter()

    async def _read(self, op: str, apply: Callable[[], _T]) -> _T:
        self.calls[op] += 1

        def counted() -> _T:
            self.table.reads[op] += 1
            return apply()

        return await with_faults(self.faults, op, counted)

    async def _write(self, op: str, apply: Callable[[], _T]) -> _T:
        self.calls[op] += 1

        def counted() -> _T:
            self.table.writes[op] += 1
            result = apply()
            if result is None or result is False:
                self.table.condition_failures[op] += 1
            return result

        return await with_faults(self.faults, op, counted)

    def _stored(self, key: str) -> Lease | None:
        """The stored lease for a conditional write; an unreadable item raises, unchanged."""
        bad = self.table.corrupt.get(key)
        if bad is not None:
            raise bad
        return self.table.leases.get(key)

    def worker_registry(self) -> MemoryWorkerMetrics:
        """This worker's view of the worker-metrics table that goes with the lease table."""
        return self.table.worker_metrics.shared()

    def _store(self, lease: Lease) -> Lease:
        self.table.leases[lease.key] = lease
        return lease

    # -- table and reads -------------------------------------------------------------------

    async def ensure_table(self) -> None:
        def apply() -> None:
            self.table.exists = True

        await self._read("ensure_table", apply)

    async def is_empty(self) -> bool:
        return await self._read(
            "is_empty", lambda: not self.table.leases and not self.table.corrupt
        )

    async def list_leases(self) -> LeaseScan:
        def apply() -> LeaseScan:
            leases = tuple(self.table.leases[k] for k in sorted(self.table.leases))
            corrupt = tuple(self.table.corrupt[k] for k in sorted(self.table.corrupt))
            self.table.items_scanned += len(leases) + len(corrupt)
            self.table.items_read["list_leases"] += len(leases) + len(corrupt)
            return LeaseScan(leases, corrupt)

        return await self._read("list_leases", apply)

    async def lease_keys_of(self, owner: str) -> tuple[str, ...]:
        def apply() -> tuple[str, ...]:
            keys = tuple(self.table.leases.keys_of(owner))
            self.table.items_scanned += len(keys)
            self.table.items_read["lease_keys_of"] += len(keys)
            return keys

        return await self._read("lease_keys_of", apply)

    async def get_lease(self, key: str) -> Lease | None:
        return await self._read("get_lease", lambda: self._stored(key))

    # -- conditional writes ----------------------------------------------------------------

    async def create_lease(self, lease: Lease) -> bool:
        def apply() -> bool:
            stored = self.table.leases.get(lease.key)
            if lease.key in self.table.corrupt:  # unreadable, but the item (and its key) exists
                item: dict[rules.Attr, rules.FieldValue] | None = {rules.Attr.KEY: lease.key}
            else:
                item = None if stored is None else rules.attributes(stored)
            if not holds(rules.create().condition, item):
                return False
            self._store(lease)
            return True

        return await self._write("create_lease", apply)

    def _apply(self, key: str, write: rules.Write) -> Lease | None:
        """A conditional update of a stored lease: None when the item is missing or the
        condition fails."""
        stored = self._stored(key)
        if stored is None or not _allows(write.condition, stored):
            return None
        return self._store(apply_update(write.update, stored))

    async def renew_lease(self, lease: Lease, throughput_kbps: float | None = None) -> Lease | None:
        write = rules.renew(lease, throughput_kbps)
        return await self._write("renew_lease", lambda: self._apply(lease.key, write))

    async def take_lease(self, lease: Lease, owner: str) -> Lease | None:
        write = rules.take(lease, owner)
        return await self._write("take_lease", lambda: self._apply(lease.key, write))

    async def release_lease(self, lease: Lease) -> Lease | None:
        write = rules.release(lease)
        return await self._write("release_lease", lambda: self._apply(lease.key, write))

    async def checkpoint(
        self, lease: Lease, checkpoint: Checkpoint, pending: Checkpoint | None = None
    ) -> Lease | None:
        """Fenced checkpoint write; ``lease_rules.checkpoint`` picks the fencing mode (see
        ``LeaseStore.checkpoint``). With ``pending`` set only the pending checkpoint is written."""
        write = rules.checkpoint(lease, checkpoint, pending)
        return await self._write("checkpoint", lambda: self._apply(lease.key, write))

    async def delete_lease(self, lease: Lease) -> bool:
        condition = rules.delete(lease).condition

        def apply() -> bool:
            stored = self._stored(lease.key)
            if stored is None or not _allows(condition, stored):
                return False
            del self.table.leases[lease.key]
            return True

        return await self._write("delete_lease", apply)

    async def update_child_shard_ids(
        self, lease: Lease, child_shard_ids: frozenset[str]
    ) -> Lease | None:
        """Conditional on counter and owner (None: no owner); see ``lease_rules``."""
        write = rules.update_child_shard_ids(lease, child_shard_ids)
        return await self._write("update_child_shard_ids", lambda: self._apply(lease.key, write))

    # -- graceful handoff (KCL 3.x) ----------------------------------------------------------

    async def start_handoff(self, lease: Lease, new_owner: str) -> Lease | None:
        """Owner becomes ``new_owner`` and ``checkpoint_owner`` the old owner; counter unchanged."""
        write = rules.start_handoff(lease, new_owner)
        return await self._write("start_handoff", lambda: self._apply(lease.key, write))

    async def finish_handoff(self, lease: Lease) -> Lease | None:
        """The old owner (``checkpoint_owner``) lets go: counter+1, ``checkpoint_owner`` removed."""
        write = rules.finish_handoff(lease)
        return await self._write("finish_handoff", lambda: self._apply(lease.key, write))

    # -- test helpers (no faults, not counted as worker calls) ------------------------------

    def put_raw(self, key: str, lease: Lease) -> None:
        """Store ``lease`` under ``key`` unconditionally (replacing any item)."""
        self.table.corrupt.pop(key, None)
        self.table.leases[key] = lease if lease.key == key else attrs.evolve(lease, key=key)

    def put_corrupt(self, key: str, attribute: str, problem: str) -> None:
        """Store an item that does not parse as a lease."""
        self.table.leases.pop(key, None)
        self.table.corrupt[key] = CorruptLeaseError(key, attribute, problem)

    def set_sticky(self, key: str, value: int | str | None, worker: str | None = None) -> None:
        """Set (or with None remove) the externally managed ``Sticky`` attribute and its
        ``stickyWorker``, as ``DynamoLeaseStore.set_sticky``. A string stands for a malformed
        value (which only the in-memory table can hold)."""
        write = rules.set_sticky(value, worker)
        stored = self.table.leases.get(key)
        if stored is None or not _allows(write.condition, stored):
            raise KeyError(f"no lease {key!r}")
        self.table.writes["set_sticky"] += 1
        self.table.leases[key] = apply_update(write.update, stored)
