"""The in-memory table's shortcuts give the answers of the plain rules they replace.

``LeaseItems.owned`` (the owner index ``lease_keys_of`` reads) must list exactly the keys a scan
of the table would, however the table was changed (the store's writes, or a test assigning items
directly); ``_allows`` (a write condition read off the stored lease) must judge as ``holds`` on
the item ``lease_rules.attributes`` builds.
"""

from __future__ import annotations

import copy
import pickle
import random

import pytest

from kclasync._adapters.memory import MemoryLeaseStore, MemoryLeaseTable
from kclasync._adapters.memory.lease_table import LeaseItems, _allows, holds
from kclasync._core.leases import lease_rules as rules
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import TRIM_HORIZON, Checkpoint

OWNERS = (None, "a", "b", "")


def scanned(items: dict[str, Lease], owner: str) -> list[str]:
    return [key for key in sorted(items) if items[key].owner == owner]


@pytest.mark.parametrize("seed", range(5))
def test_owner_index_follows_every_change(seed: int) -> None:
    rng = random.Random(seed)
    items = LeaseItems()
    for _ in range(3000):
        key = f"s{rng.randrange(40)}"
        lease = Lease(key, owner=rng.choice(OWNERS))
        step = rng.randrange(8)
        if step < 3:
            items[key] = lease
        elif step == 3:
            items.pop(key, None)
        elif step == 4 and key in items:
            del items[key]
        elif step == 5:
            items.update({key: lease})
        elif step == 6:
            items.setdefault(key, lease)
        elif items and rng.random() < 0.2:
            items.popitem()
        for owner in OWNERS[1:]:
            assert items.keys_of(owner) == scanned(items, owner)
    copied = pickle.loads(pickle.dumps(items))
    assert copied == items and copied.owned == items.owned and copied is not items
    assert copy.deepcopy(items).owned == items.owned
    items.clear()
    assert items.owned == {} and items.keys_of("a") == []


async def test_lease_keys_of_after_writes_and_direct_assignment() -> None:
    table = MemoryLeaseTable()
    store = MemoryLeaseStore(table)
    for i in range(6):
        assert await store.create_lease(Lease(f"s{i}", checkpoint=TRIM_HORIZON))
    for key in ("s4", "s1", "s3"):
        stored = table.get(key)
        assert stored is not None and await store.take_lease(stored, "a") is not None
    assert await store.lease_keys_of("a") == ("s1", "s3", "s4")
    table.leases["s0"] = Lease("s0", owner="a", counter=9)  # as the runtime tests do
    held = table.get("s3")
    assert held is not None and await store.release_lease(held) is not None
    assert await store.lease_keys_of("a") == ("s0", "s1", "s4")
    gone = table.get("s1")
    assert gone is not None and await store.delete_lease(gone)
    store.put_corrupt("s4", "leaseCounter", "is missing")
    assert await store.lease_keys_of("a") == ("s0",)
    assert await store.lease_keys_of("nobody") == ()
    assert table.reads["lease_keys_of"] == 4 and table.items_read["lease_keys_of"] == 3 + 3 + 1


_VALUES: dict[rules.Attr, tuple[object, ...]] = {
    rules.Attr.KEY: ("s1", ""),
    rules.Attr.COUNTER: (0, 1, 2),
    rules.Attr.OWNER: (None, "a", "b", ""),
    rules.Attr.CHECKPOINT_OWNER: (None, "a", "b"),
    rules.Attr.OWNER_SWITCHES: (0, 1),
    rules.Attr.CHECKPOINT: (TRIM_HORIZON, Checkpoint("5")),
    rules.Attr.PENDING_CHECKPOINT: (None, Checkpoint("5")),
    rules.Attr.CHILD_SHARD_IDS: (frozenset(), frozenset({"x"})),
    rules.Attr.THROUGHPUT: (None, 0.0, 1.5),
    rules.Attr.STICKY: (None, 10, "bad"),
    rules.Attr.STICKY_WORKER: (None, "a"),
}


def _condition(rng: random.Random, depth: int = 0) -> rules.Condition:
    kind = rng.randrange(4 if depth < 2 else 3)
    attr = rng.choice(list(rules.Attr))
    if kind == 0:
        return rules.Exists(attr)
    if kind == 1:
        return rules.Missing(attr)
    if kind == 2:
        return rules.Equals(attr, rng.choice(_VALUES[attr]))  # type: ignore[arg-type]
    return rules.All(tuple(_condition(rng, depth + 1) for _ in range(rng.randrange(4))))


def test_conditions_judged_on_the_lease_as_on_its_item() -> None:
    rng = random.Random(11)
    outcomes = set()
    for _ in range(20_000):
        lease = Lease(**{a.value: rng.choice(v) for a, v in _VALUES.items()})  # type: ignore[arg-type]
        condition = _condition(rng)
        expected = holds(condition, rules.attributes(lease))
        assert _allows(condition, lease) is expected, (condition, lease)
        outcomes.add(expected)
    assert outcomes == {True, False}
    assert _allows(rules.Missing(rules.Attr.KEY), None)
    assert not _allows(rules.Exists(rules.Attr.KEY), None)
