"""DynamoDB request units and on-demand prices for the calls a fleet makes (``dynamodb_cost``).

Owns: the size of an item as DynamoDB counts it, the request units each operation of the lease
table, its owner index, the coordinator-state table and the worker registry costs (with the
consistency the real adapters send), and the list prices used. Must not: run a fleet.

What the adapters send (``kclasync/_adapters/dynamodb.py``, ``worker_metrics_table.py``,
``coordinator_state.py``):

* lease table: ``Scan`` with ``ConsistentRead=True`` (``list_leases``; ``is_empty`` with
  ``Limit=1``), ``GetItem`` with ``ConsistentRead=True`` (``get_lease``), ``Query`` on the
  ``LeaseOwnerToLeaseKeyIndex`` GSI (``lease_keys_of``; a GSI read is always eventually
  consistent: half a unit per 4 KB), ``UpdateItem`` / ``PutItem`` / ``DeleteItem`` for writes.
  The GSI is ``KEYS_ONLY`` (``leaseOwner`` hash, ``leaseKey`` range), so a write touches it only
  when ``leaseOwner`` changes: one index write when an owner appears or disappears, two (delete
  and put) when it changes from one worker to another.
* worker registry (``<app>-WorkerMetricStats``): ``UpdateItem`` per report, ``Scan`` with
  ``ConsistentRead=True`` per ``list_workers``, ``DeleteItem`` per removal.
* coordinator state: ``GetItem`` with ``ConsistentRead=True`` for the lock and the migration
  item, ``PutItem`` (create, replace, release) for the lock.

A write costs one unit per started KB of the larger of the item before and after; a refused
conditional write costs as one. A read costs per started 4 KB: a ``GetItem`` of its item, a
``Scan`` or ``Query`` of the items of one response page (up to 1 MB) summed.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from kclasync._core.leases.lock_term import SUCCESSORS

#: DynamoDB on-demand list prices, us-east-1, standard table class (the prices AWS lists since
#: its November 2024 reduction), US dollars per million request units.
PRICE_REGION = "us-east-1"
PRICE_PER_MILLION_WRITE_UNITS = 0.625
PRICE_PER_MILLION_READ_UNITS = 0.125
HOURS_PER_MONTH = 730.0

PAGE_BYTES = 1024 * 1024
READ_UNIT_BYTES = 4096
WRITE_UNIT_BYTES = 1024


def _number_size(text: str) -> int:
    digits = text.lstrip("-").replace(".", "").lstrip("0") or "0"
    digits = digits.split("e")[0].split("E")[0]
    return (len(digits) + 1) // 2 + 1


def value_size(value: dict[str, Any]) -> int:
    """Bytes DynamoDB counts for one attribute value in the low-level JSON form."""
    ((dtype, inner),) = value.items()
    if dtype == "S":
        return len(str(inner).encode())
    if dtype == "N":
        return _number_size(str(inner))
    if dtype == "B":
        return len(inner)
    if dtype in ("BOOL", "NULL"):
        return 1
    if dtype == "SS":
        return sum(len(s.encode()) for s in inner)
    if dtype == "NS":
        return sum(_number_size(n) for n in inner)
    if dtype == "L":
        return 3 + sum(1 + value_size(v) for v in inner)
    if dtype == "M":
        return 3 + sum(1 + len(k.encode()) + value_size(v) for k, v in inner.items())
    raise ValueError(f"unknown DynamoDB type {dtype!r}")


def item_size(item: dict[str, Any]) -> int:
    """Bytes of an item: attribute names plus values."""
    return sum(len(name.encode()) + value_size(v) for name, v in item.items())


def write_units(size: float) -> int:
    return max(1, math.ceil(size / WRITE_UNIT_BYTES))


def read_units(items: float, item_bytes: float, *, consistent: bool) -> float:
    """Units of one ``Scan``/``Query`` returning ``items`` items of ``item_bytes`` on average
    (or one ``GetItem`` with ``items=1``), paged by 1 MB."""
    total = max(items * item_bytes, 1.0)
    pages = max(1, math.ceil(total / PAGE_BYTES))
    units = 0
    left = total
    for _ in range(pages):
        units += math.ceil(min(left, PAGE_BYTES) / READ_UNIT_BYTES)
        left -= PAGE_BYTES
    return float(units) if consistent else units / 2.0


def dollars(write_units_: float, read_units_: float) -> float:
    return float(
        Decimal(str(write_units_)) * Decimal(str(PRICE_PER_MILLION_WRITE_UNITS)) / 10**6
        + Decimal(str(read_units_)) * Decimal(str(PRICE_PER_MILLION_READ_UNITS)) / 10**6
    )


#: Index items of ``LeaseOwnerToLeaseKeyIndex`` (KEYS_ONLY): the two key attributes; the
#: lengths used for ``leaseKey`` and ``leaseOwner`` values are the simulation's.
def index_item_size(lease_key: str, owner: str) -> int:
    return len("leaseKey") + len(lease_key) + len("leaseOwner") + len(owner)


__all__ = [
    "HOURS_PER_MONTH",
    "PRICE_PER_MILLION_READ_UNITS",
    "PRICE_PER_MILLION_WRITE_UNITS",
    "PRICE_REGION",
    "dollars",
    "index_item_size",
    "item_size",
    "read_units",
    "write_units",
]


#: Production-like item sizes (``dynamodb_cost.typical_sizes``): a lease item, a registry entry,
#: an owner-index item (keys only).
LEASE_BYTES = 327
ENTRY_BYTES = 176
INDEX_BYTES = 40


def projected_month(family: str, workers: int, leases: int) -> float:
    """US $ per month of the lease protocol for a fleet, from the per-worker rates at the
    defaults (failover 10 s, leader heartbeat 30 s; checkpoints left out).

    ``family``: ``early`` (kcl2 or balanced with ``early_failover``), ``noef`` (the same
    without), ``leader`` (kcl3 or load). The rates: renewals 1,088 per lease-hour; ``early``:
    a registry write every 0.5 s per worker, and every 0.25 s a registry scan by the leader
    and a read of the leader's entry (its silence digest: one read unit) by every other
    worker, a table scan every 20.05 s per worker; ``noef``: a registry write and read and a
    table scan per worker every 10.025 s / renewal round; ``leader``: the leader scans the
    table about every 11.5 s, every worker queries the owner index and writes its entry once
    per renewal round (3.3 s), about 30 more writes per lease-hour for the leader's moves
    (measured), and with early failover (the default) the leader scans the registry six times
    per renewal round (6,529 an hour) to notice a silent worker. Every worker reads the leader
    lock every 30 s, except in ``leader`` with early failover: there the leader and the two
    successors it names read it every failover / 4 (2.5 s, the lock's short term in a fleet of
    kclasync workers only; ``core.lock_term``), the others every 30 s; about 55 single-lease
    reads per lease-hour with early failover.
    """
    w, n = workers, leases
    scan = read_units(n, LEASE_BYTES, consistent=True)
    registry = read_units(w, ENTRY_BYTES, consistent=True)
    lock = w * 120.0
    if family == "early":
        reads = w * 180 * scan + 14_400 * (registry + (w - 1)) + lock + 55.0 * n
        writes = n * 1_088 + w * 7_200 + 3.0 * n
    elif family == "noef":
        reads = w * 359 * scan + w * 359 * registry + lock
        writes = n * 1_088 + w * 1_088 + 1.0 * n
    elif family == "leader":
        query = read_units(n / w, INDEX_BYTES, consistent=False)
        fast = min(w, 1 + SUCCESSORS)
        lock = fast * 1_440.0 + (w - fast) * 120.0
        reads = 313 * scan + w * 1_088 * query + 20.0 * n + lock + 6_529 * registry
        writes = n * 1_088 + w * 1_088 + 30.0 * n
    else:
        raise ValueError(f"unknown family {family!r}")
    return dollars(writes * HOURS_PER_MONTH, reads * HOURS_PER_MONTH)
