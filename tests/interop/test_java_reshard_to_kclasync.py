"""Resharding across implementations, Java first: the Java KCL 3.x (one MultiLangDaemon) reads a
stream through a split and a merge, is killed (SIGKILL) while it reads the children, and two
kclasync workers finish.

Records carry (key, counter). The first 600 records are read by Java before the reshard; the
next 400 only go to keys of the split children, so the merge child has no record yet and its
lease stays at TRIM_HORIZON: 200, until Java has checkpointed in a split child, then 200 more,
and Java is killed as soon as it has read one of those. The
merge child's lease is then deleted: the table a worker leaves when it dies between its parents'
SHARD_END and the child's creation (an older kclasync, or a Java worker that got no ChildShards).
Then 300 records go to every key and kclasync takes over.

Asserted: every record processed (0 lost); kclasync reprocesses only what Java processed beyond
the checkpoints it left; no child shard read before the last record of each parent, and per key
the records are first read in counter order across parent and child shards; kclasync creates the
merge child's lease at start although the dead Java leader's lock (120 s) still stands; the Java
log shows no parse failure and the kclasync logs no error.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterable

import orjson
import pytest

from kclasync._adapters.coordinator_state import DynamoCoordinatorState, coordinator_table_name
from kclasync.testing.emulators import LocalAws
from tests.interop.fleet import (
    KEYS,
    Delivery,
    KclasyncProcess,
    Rid,
    Watch,
    checkpoints,
    children_after_parents,
    delivered,
    produce,
    reshard,
)
from tests.interop.java_kcl import JavaKcl
from tests.support import Aws, aws_for, wait_until

#: One JVM start-up (about 6 s to the first read) and about 20 s more: 28 s measured on a quiet
#: machine; the bound leaves room for a loaded one.
pytestmark = [pytest.mark.asyncio, pytest.mark.interop, pytest.mark.timeout(300)]

log = logging.getLogger(__name__)

#: Well below the 120 s the Java leader's lock lasts: kclasync must not wait for a leader to
#: create the merge child's lease.
KCLASYNC_BOUND = 60.0
#: kclasync log lines that would mean something went wrong.
KCLASYNC_ERRORS = re.compile(r"Traceback|Error|exception|failed|corrupt", re.IGNORECASE)


def hash_key(key: str) -> int:
    return int(hashlib.md5(key.encode()).hexdigest(), 16)


async def produce_keys(aws: Aws, first: int, count: int, keys: list[str]) -> set[Rid]:
    """Records ``first .. first+count-1`` on the given partition keys only."""
    sent = [(keys[i % len(keys)], i) for i in range(first, first + count)]
    entries = [(k, orjson.dumps({"k": k, "c": i})) for k, i in sent]
    while entries:
        chunk, entries = entries[:500], entries[500:]
        results = await aws.stream.put_records(aws.name, chunk)
        entries = [e for e, r in zip(chunk, results, strict=True) if r is None] + entries
    return set(sent)


def after_checkpoints(deliveries: Iterable[Delivery], checkpoints: dict[str, str]) -> set[Rid]:
    """Records delivered after the checkpoint of their shard: all of a shard at TRIM_HORIZON
    (or without a lease), none of a shard at SHARD_END."""
    out = set()
    for d in deliveries:
        cp = checkpoints.get(d.shard, "TRIM_HORIZON")
        if cp == "TRIM_HORIZON" or (cp.isdigit() and d.seq > int(cp)):
            out.add(d.rid)
    return out


def order_breaks(deliveries: Iterable[Delivery]) -> list[str]:
    """Keys whose records were first read out of counter order (each record's first delivery),
    across implementations and across parent and child shards."""
    first: dict[Rid, Delivery] = {}
    for d in sorted(deliveries, key=lambda d: d.at):
        first.setdefault(d.rid, d)
    by_key: dict[str, list[Delivery]] = {}
    for d in first.values():
        by_key.setdefault(d.rid[0], []).append(d)
    out = []
    for key, ds in by_key.items():
        ds.sort(key=lambda d: d.rid[1])
        out += [
            f"{key}: {a.rid[1]} on {a.shard} at {a.at:.3f}, {b.rid[1]} on {b.shard} at {b.at:.3f}"
            for a, b in zip(ds[1:], ds, strict=False)
            if a.at < b.at
        ]
    return out


async def test_java_reads_through_reshard_then_kclasync_finishes(
    kinesis: LocalAws, unique_name: str, java_kcl: Callable[..., JavaKcl]
) -> None:
    began = time.monotonic()
    async with aws_for(kinesis, unique_name) as aws:
        await aws.create_stream(4)
        watch = Watch(aws).start()
        locks = DynamoCoordinatorState(aws.dynamodb, coordinator_table_name(unique_name))
        produced = await produce(aws, 0, 600)
        assert await aws.create_leases() == 4  # Java starts on leases, without its random wait
        java = java_kcl(stream=unique_name, application=unique_name, worker_id="java-1")
        java.start()

        async def java_read_all() -> bool:
            assert java.running, "the Java daemon exited:\n" + java.log()[-3000:]
            return produced <= delivered(java.deliveries())

        await wait_until(java_read_all, 150, "Java to read the first part")
        lineage = await reshard(aws)  # while Java reads
        (merged,) = (child for child, parents in lineage.items() if len(parents) == 2)
        split = {child for child, parents in lineage.items() if len(parents) == 1}
        ranges = {s.shard_id: s.hash_range for s in await aws.stream.list_shards(aws.name)}
        to_split = [
            k
            for k in (f"key-{i}" for i in range(KEYS))
            if any(ranges[c].start <= hash_key(k) <= ranges[c].end for c in split)
        ]
        produced |= await produce_keys(aws, 600, 200, to_split)

        async def java_checkpointed_a_child() -> bool:
            assert java.running, "the Java daemon exited:\n" + java.log()[-3000:]
            return any(cp.isdigit() for s, cp in (await checkpoints(aws)).items() if s in split)

        await wait_until(java_checkpointed_a_child, 60, "Java to read a split child")
        produced |= await produce_keys(aws, 800, 200, to_split)

        def java_reads_on() -> bool:
            assert java.running, "the Java daemon exited:\n" + java.log()[-3000:]
            return any(d.rid[1] >= 800 for d in java.deliveries())

        workers = [
            KclasyncProcess(
                kinesis,
                stream=unique_name,
                application=unique_name,
                worker_id=worker_id,
                workdir=java.workdir,
                lease_taker="balanced",
            ).start(held=True)  # its imports done before the kill
            for worker_id in ("py-a", "py-b")
        ]
        try:
            await wait_until(java_reads_on, 30, "Java to read on in the split children")
            java.stop(kill=True)  # while it reads the split children
            killed = time.time()
            before = java.deliveries()
            allowed = after_checkpoints(before, await checkpoints(aws))
            left = {lease.key: lease for lease in (await aws.store.list_leases()).leases}
            assert all(left[p].checkpoint.value == "SHARD_END" for p in lineage[merged]), left
            # Java's order: the children's leases before the parents' SHARD_END. Take the unread
            # merge child's away, as a worker killed between the two would have left the table.
            assert left[merged].checkpoint.value == "TRIM_HORIZON", left[merged]
            assert await aws.store.delete_lease(left[merged])
            produced |= await produce(aws, 1000, 300)

            for w in workers:
                w.release()

            def kclasync_done() -> bool:
                after = [d for w in workers for d in w.deliveries()]
                return produced <= delivered(before) | delivered(after)

            await wait_until(kclasync_done, KCLASYNC_BOUND, "kclasync to finish")
            finished = time.time()
            lock = await locks.get_lock("Leader")
            await watch.sample()
        finally:
            for w in workers:
                w.stop()
            await watch.stop()
    after = [d for w in workers for d in w.deliveries()]
    everything = before + after
    lost = produced - delivered(everything)
    redone = delivered(before) & delivered(after)
    first_read = min(d.at for d in after) - killed
    log.warning(
        "Java (SIGKILL, mid-reshard, merge child lease missing) -> kclasync: produced %d, "
        "lost %d, reprocessed %d (allowed %d), %.1f s until kclasync read, %.1f s until it "
        "finished; the test took %.0f s; checkpoints at the kill: %s",
        len(produced),
        len(lost),
        len(redone),
        len(allowed),
        first_read,
        finished - killed,
        time.monotonic() - began,
        {k: v.checkpoint.value[-6:] for k, v in left.items()},
    )
    assert not lost, sorted(lost)[:10]
    assert redone <= allowed, sorted(redone - allowed)[:10]
    assert not children_after_parents(everything, lineage)
    assert not order_breaks(everything), order_breaks(everything)[:10]
    # Java read through the reshard: the parents' last records and a split child's first ones.
    assert {d.shard for d in before} >= {*lineage[merged], *lineage[min(split)]}
    assert any(d.shard == merged for d in after)
    # The merge child's lease came from a kclasync worker's start-up sync, with the dead
    # Java leader's lock still standing.
    assert lock is not None and lock.owner == "java-1", lock
    logs = "\n".join(w.log() for w in workers)
    assert "shard sync of" in logs and "created 1 leases" in logs, logs[-3000:]
    assert not java.parse_failures(), java.parse_failures()[:5]
    assert not watch.not_leases, watch.not_leases[:3]
    errors = [line for line in logs.splitlines() if KCLASYNC_ERRORS.search(line)]
    assert not errors, errors[:10]
