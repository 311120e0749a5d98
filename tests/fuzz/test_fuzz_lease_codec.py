"""Fuzzing the lease-item parser: any attribute, with any DynamoDB type, gives a well-typed
``Lease`` or a ``CorruptLeaseError`` naming that attribute.

The lease coordinator skips a corrupt lease, counts it (``kclasync_corrupt_leases``) and logs
the error once; any other exception would stop the taker or the renewer. ``Sticky`` is managed
by people and scripts: a malformed value never makes the lease corrupt, it is kept as a
description (``Lease.sticky`` is a ``str``), treated as normal and reported once.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from kclasync._adapters import lease_codec as c
from kclasync._core.leases.lease import CorruptLeaseError, Lease, StickyMode
from kclasync._core.leases.position import Checkpoint, Sentinel
from kclasync._core.lineage.shard import MAX_HASH_KEY, HashRange
from tests.fuzz.profile import FUZZ

ATTRIBUTES = [
    c.LEASE_KEY,
    c.LEASE_OWNER,
    c.LEASE_COUNTER,
    c.OWNER_SWITCHES,
    c.CHECKPOINT,
    c.CHECKPOINT_SUBSEQ,
    c.PENDING_CHECKPOINT,
    c.PENDING_CHECKPOINT_SUBSEQ,
    c.PARENT_SHARD_ID,
    c.CHILD_SHARD_IDS,
    c.STARTING_HASH_KEY,
    c.ENDING_HASH_KEY,
    c.THROUGHPUT_KBPS,
    c.CHECKPOINT_OWNER,
    c.STICKY,
    c.STICKY_WORKER,
]

names = st.text(min_size=1, max_size=10)
sequence = st.integers(0, 2**128).map(str)
checkpoints = st.builds(
    Checkpoint,
    st.one_of(st.sampled_from([s.value for s in Sentinel]), sequence),
    st.integers(0, 2**31),
)
hash_ranges = st.tuples(st.integers(0, MAX_HASH_KEY), st.integers(0, MAX_HASH_KEY)).map(
    lambda t: HashRange(min(t), max(t))
)
leases = st.builds(
    Lease,
    key=names,
    counter=st.integers(0, 2**63),
    owner=st.none() | names,
    checkpoint=checkpoints,
    pending_checkpoint=st.none() | checkpoints,
    owner_switches_since_checkpoint=st.integers(0, 2**31),
    parent_shard_ids=st.frozensets(names, max_size=2),
    child_shard_ids=st.frozensets(names, max_size=2),
    hash_range=st.none() | hash_ranges,
    throughput_kbps=st.none() | st.floats(0, 1e9),
    checkpoint_owner=st.none() | names,
    sticky=st.none() | st.sampled_from([-1, 0, 10, 20]) | st.integers(-(2**40), 2**40),
    sticky_worker=st.none() | names,
)

# The mutation tests start from a few fixed leases, so that the examples go into the values.
BASES = [
    Lease("shardId-000000000000"),
    Lease(
        "app:stream:1:shardId-000000000007",
        counter=42,
        owner="worker-a",
        checkpoint=Checkpoint("49590338271490256608559692538361571095921575989136588898", 3),
        pending_checkpoint=Checkpoint("49590338271490256608559692538361571095921575989136588899"),
        owner_switches_since_checkpoint=2,
        parent_shard_ids=frozenset({"shardId-000000000001", "shardId-000000000002"}),
        child_shard_ids=frozenset({"shardId-000000000009"}),
        hash_range=HashRange(0, MAX_HASH_KEY // 2),
        throughput_kbps=12.5,
        checkpoint_owner="worker-b",
        sticky=10,
        sticky_worker="worker-a",
    ),
    Lease("shardId-000000000003", counter=7, owner="w", checkpoint=Checkpoint("SHARD_END")),
]
bases = st.sampled_from(BASES)

# Text a DynamoDB N attribute may hold, and some it should not.
number_text = st.one_of(
    st.integers(-(10**40), 10**40).map(str),
    st.floats().map(repr),
    st.sampled_from(
        ["", " 7 ", "1_0", "1e3", "-0", "NaN", "-inf", "²", "٣", "0x10", "9" * 5000, "1" * 39]
    ),
    st.text(max_size=8),
)
scalar_attr = st.one_of(
    st.builds(lambda v: {"S": v}, st.text(max_size=12)),
    st.builds(lambda v: {"N": v}, number_text),
    st.builds(lambda v: {"B": v}, st.binary(max_size=8)),
    st.builds(lambda v: {"SS": v}, st.lists(st.text(max_size=8), max_size=3)),
    st.builds(lambda v: {"NS": v}, st.lists(number_text, max_size=3)),
    st.builds(lambda v: {"BS": v}, st.lists(st.binary(max_size=4), max_size=3)),
    st.builds(lambda v: {"BOOL": v}, st.booleans()),
    st.just({"NULL": True}),
)
dynamo_attr = st.recursive(
    scalar_attr,
    lambda inner: st.one_of(
        st.builds(lambda v: {"M": v}, st.dictionaries(st.text(max_size=6), inner, max_size=3)),
        st.builds(lambda v: {"L": v}, st.lists(inner, max_size=3)),
    ),
    max_leaves=6,
)
# Shapes botocore never produces, for the parser's own robustness.
odd_attr = st.one_of(
    st.just({}),
    st.builds(
        lambda t, v: {t: v},
        st.sampled_from(["S", "N", "SS"]),
        st.none() | st.integers() | st.lists(st.integers(), max_size=2) | st.text(max_size=4),
    ),
    st.builds(lambda a, b: {**a, **b}, scalar_attr, scalar_attr),
    st.none(),
    st.text(max_size=5),
    st.integers(),
)


def check(item: dict[str, Any], changed: str | None = None) -> Lease | CorruptLeaseError:
    try:
        lease = c.item_to_lease(item)
    except CorruptLeaseError as exc:
        assert exc.problem and exc.attribute in str(exc)
        if changed is not None:
            assert changed in (exc.attribute, *str(exc).split("'")), (changed, str(exc))
        return exc
    assert isinstance(lease.key, str) and lease.key
    assert isinstance(lease.counter, int) and lease.counter >= 0
    assert lease.owner is None or isinstance(lease.owner, str)
    for cp in (lease.checkpoint, lease.pending_checkpoint):
        if cp is not None:
            assert isinstance(cp.value, str)
            assert isinstance(cp.sub_sequence, int) and cp.sub_sequence >= 0
            if cp.is_sequence:
                int(cp.value)  # ordering compares sequence numbers as integers
    assert isinstance(lease.owner_switches_since_checkpoint, int)
    for ids in (lease.parent_shard_ids, lease.child_shard_ids):
        assert isinstance(ids, frozenset) and all(isinstance(i, str) for i in ids)
    assert lease.hash_range is None or isinstance(lease.hash_range, HashRange)
    tp = lease.throughput_kbps
    assert tp is None or (isinstance(tp, float) and math.isfinite(tp) and tp >= 0)
    assert lease.checkpoint_owner is None or isinstance(lease.checkpoint_owner, str)
    assert lease.sticky is None or isinstance(lease.sticky, (int, str))
    assert lease.sticky_mode is None or isinstance(lease.sticky_mode, StickyMode)
    assert lease.sticky_worker is None or isinstance(lease.sticky_worker, str)
    return lease


@FUZZ
@given(leases)
def test_round_trip(lease: Lease) -> None:
    assert check(c.lease_to_item(lease)) == lease


@FUZZ
@example(BASES[1], c.THROUGHPUT_KBPS, {"N": "NaN"})
@example(BASES[1], c.THROUGHPUT_KBPS, {"N": "-1"})
@example(BASES[1], c.CHECKPOINT, {"S": "٣"})
@example(BASES[1], c.LEASE_COUNTER, {"N": "9" * 5000})
@given(bases, st.sampled_from(ATTRIBUTES), dynamo_attr)
def test_any_attribute_any_type(lease: Lease, name: str, value: dict[str, Any]) -> None:
    item = c.lease_to_item(lease)
    item[name] = value
    result = check(item, name)
    if name in (c.STICKY, c.STICKY_WORKER):
        assert isinstance(result, Lease), "a bad Sticky value must not make the lease corrupt"


@FUZZ
@example(BASES[1], c.PARENT_SHARD_ID, {"SS": "shardId-1"})
@example(BASES[1], c.CHILD_SHARD_IDS, {"SS": 5})
@example(BASES[1], c.PARENT_SHARD_ID, {"SS": [1, 2]})
@example(BASES[1], c.STARTING_HASH_KEY, {"S": [1]})
@example(BASES[1], c.THROUGHPUT_KBPS, {"N": [1]})
@example(BASES[1], c.LEASE_OWNER, {"S": 5})
@example(BASES[1], c.CHECKPOINT, {"S": "²"})
@given(bases, st.sampled_from(ATTRIBUTES), odd_attr)
def test_odd_attribute_shapes(lease: Lease, name: str, value: Any) -> None:
    item: dict[str, Any] = c.lease_to_item(lease)
    item[name] = value
    check(item, name)


@FUZZ
@given(bases, st.lists(st.sampled_from(ATTRIBUTES), min_size=1, max_size=4, unique=True))
def test_missing_attributes(lease: Lease, missing: list[str]) -> None:
    item = c.lease_to_item(lease)
    for name in missing:
        item.pop(name, None)
    result = check(item)
    required = {c.LEASE_KEY, c.LEASE_COUNTER, c.CHECKPOINT} & set(missing)
    if required:
        assert isinstance(result, CorruptLeaseError)
        assert result.attribute in required
    else:
        assert isinstance(result, Lease)


@FUZZ
@given(st.dictionaries(st.sampled_from([*ATTRIBUTES, "other"]), dynamo_attr, max_size=8))
def test_arbitrary_items(item: dict[str, Any]) -> None:
    check(item)


@FUZZ
@given(bases, st.one_of(dynamo_attr, odd_attr))
def test_sticky_any_value(lease: Lease, value: Any) -> None:
    """Any Sticky value: a number that is a whole number is kept, anything else is described
    (and so counted and reported by the coordinator), never an error."""
    item: dict[str, Any] = c.lease_to_item(lease)
    item[c.STICKY] = value
    result = check(item)
    assert isinstance(result, Lease)
    whole: int | None = None
    if isinstance(value, dict) and "N" in value:
        try:
            whole = int(str(value["N"]))
        except ValueError:
            whole = None
    if value is None:
        assert result.sticky is None
    elif whole is not None:
        assert result.sticky == whole
    else:
        assert isinstance(result.sticky, str), "a malformed Sticky is kept as a description"
        assert result.sticky_mode is None  # reported by the coordinator, treated as normal
