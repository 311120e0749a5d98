"""Chaos soak: worker processes against real emulators, killed, stalled and restarted for minutes.

Run from the repository root:
``uv run python -m benchmarks.chaos_soak [--seconds 600] [--workers 5] [--kinesis-local] [--json]``.

A steady producer writes to a stream on moto's server (one PutRecords request at a time: moto loses
records under concurrent ones) while ``--workers`` consumer processes share it. Once every first
worker consumes, a seeded chaos loop repeatedly picks a worker that consumes and SIGKILLs it (and
starts a replacement), SIGSTOPs it for 1.5-2.5 x the failover time and SIGCONTs it, or stops it
gracefully with SIGTERM (and starts a replacement). The first ``--long-lived`` workers are never
killed or stopped (only stalled), so their memory and file descriptors can be compared over the
whole run. With ``--kinesis-local`` the stream lives on kinesis-local (DynamoDB stays on moto) and
a shard is split or two adjacent shards merged every ``--reshard-every`` seconds.

Each worker (``benchmarks/chaos_soak_fleet.py``) appends one line per record to its own file
before the batch is checkpointed. At the end the producer stops, the fleet drains, and the soak
reports:

- records produced (acknowledged by the stream) and lost (acknowledged, never processed);
- duplicates: a stream record (shard, sequence) processed more than once. Each is attributed to
  the workers that processed it: ``kill`` if one of them was SIGKILLed, else ``stall`` if one
  was SIGSTOPped (a stalled worker loses its leases and may finish the batch it was in), else
  ``lease_lost`` if one of them logged ``lost lease <shard>`` for that shard (its renewals
  stopped in time though nothing was done to it: CPU starvation of a loaded machine, with the
  2 s failover), else ``planned_move`` (only graceful stops involved) or ``none``; those last
  two are failures;
- per long-lived process: RSS and open file descriptors read from ``/proc`` 15 s after its first
  delivery (start) and after the drain (end), flagged when they grew by more than the limits
  in ``chaos_soak_verdict.py``.

Exit status 1 when a record was lost, a duplicate is unattributed, or a long-lived process grew.
Owns: the soak's producer, chaos and resharding (its verdict: ``chaos_soak_verdict.py``).
Everything is bounded in time: the chaos period, then a drain of at most ``drain_timeout``
seconds, then a graceful shutdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson

from benchmarks.chaos_soak_fleet import ROOT, Deliveries, Fleet, fault_front
from benchmarks.chaos_soak_verdict import ProcessFigures, SoakResult, attribute
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync.testing.emulators import LocalAws, find_kinesis_local, kinesis_local, moto_process

SAMPLE_EVERY = 10.0
WARMUP_LIMIT = 90.0


@attrs.frozen(kw_only=True)
class SoakSettings:
    seconds: float = 600.0
    workers: int = 5
    long_lived: int = 2
    shards: int = 8
    rate: float = 150.0  # records per second
    failover: float = 2.0
    seed: int = 1
    chaos_interval: tuple[float, float] = (2.0, 5.0)
    reshard_every: float | None = None
    max_shards: int = 8
    drain_timeout: float = 180.0
    #: The fault proxy between workers and emulators (0 and False: none; see ``fault_front``).
    faults: float = 0.0
    fault_latency: float = 0.0
    limits: bool = False


async def _chaos(
    fleet: Fleet, s: SoakSettings, rng: random.Random, until: float, actions: Counter[str]
) -> None:
    kinds: list[str] = []
    while fleet.now() < until:
        await asyncio.sleep(rng.uniform(*s.chaos_interval))
        if fleet.now() >= until:
            return
        candidates = [w for w in fleet.alive() if w.worker_id not in fleet.stalled_now]
        if len(candidates) < 2:
            continue
        if not kinds:  # every kind once per round, in a seeded order
            kinds = ["sigstop", "sigkill", "graceful_stop"]
            rng.shuffle(kinds)
        kind = kinds.pop()
        if kind != "sigstop":  # long-lived workers are only ever stalled
            candidates = [w for w in candidates if not w.long_lived]
        # Only workers that consume already: killing a process that is still starting proves
        # little. Stalls may hit a starting worker when no other is left.
        busy = [w for w in candidates if w.first_delivery is not None]
        if not busy and (kind != "sigstop" or not candidates):
            kinds.append(kind)  # try this kind again next time
            continue
        victim = rng.choice(sorted(busy or candidates, key=lambda w: w.worker_id))
        if victim.first_delivery is None:
            actions[f"{kind}_while_starting"] += 1
        if kind == "sigstop":
            actions["sigstop"] += 1
            await fleet.stall(victim, rng.uniform(1.5, 2.5) * s.failover)
        elif kind == "sigkill":
            actions["sigkill"] += 1
            await fleet.kill(victim)
            fleet.start()
        else:
            actions["graceful_stop"] += 1
            await fleet.stop(victim)
            fleet.start()


class Producer:
    """One PutRecords request at a time at a steady rate; failed entries are retried."""

    def __init__(self, client: KinesisStreamClient, stream: str, rate: float) -> None:
        self.client = client
        self.stream = stream
        self.rate = rate
        self.acked: list[int] = []
        self.next_id = 0
        self.errors = 0
        self._stopping = False

    def stop(self) -> None:
        self._stopping = True

    async def run(self, now: Any) -> None:
        tick = 0.25
        batch = max(1, round(self.rate * tick))
        next_at = now()
        while not self._stopping:
            ids = list(range(self.next_id, self.next_id + batch))
            self.next_id += batch
            pending = [(i, f"key-{i % 997}", orjson.dumps({"id": i})) for i in ids]
            while pending:
                try:
                    results = await self.client.put_records(
                        self.stream, [(pk, data) for _, pk, data in pending]
                    )
                except Exception:  # an emulator hiccup: retry the whole request
                    self.errors += 1
                    await asyncio.sleep(0.2)
                    continue
                self.acked += [i for (i, _, _), r in zip(pending, results, strict=True) if r]
                pending = [e for e, r in zip(pending, results, strict=True) if r is None]
            next_at += tick
            await asyncio.sleep(max(0.0, next_at - now()))


async def _reshard(
    client: KinesisStreamClient,
    stream: str,
    rng: random.Random,
    every: float,
    until: float,
    now: Any,
    counts: Counter[str],
    max_shards: int,
) -> None:
    raw = client._client
    while now() + every < until:
        await asyncio.sleep(every)
        try:
            shards = sorted(
                (s for s in await client.list_shards(stream) if s.is_open),
                key=lambda s: s.hash_range.start,
            )
            pairs = [
                (a, b)
                for a, b in itertools.pairwise(shards)
                if a.hash_range.end + 1 == b.hash_range.start
            ]
            if pairs and (len(shards) >= max_shards or rng.random() < 0.5):
                low, high = rng.choice(pairs)
                await raw.merge_shards(
                    StreamName=stream, ShardToMerge=low.shard_id, AdjacentShardToMerge=high.shard_id
                )
                counts["merge"] += 1
            else:
                shard = rng.choice(shards)
                middle = (shard.hash_range.start + shard.hash_range.end) // 2 + 1
                await raw.split_shard(
                    StreamName=stream, ShardToSplit=shard.shard_id, NewStartingHashKey=str(middle)
                )
                counts["split"] += 1
            deadline = now() + 30
            while now() < deadline:
                resp = await raw.describe_stream_summary(StreamName=stream)
                if resp["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                    break
                await asyncio.sleep(0.1)
        except Exception as exc:  # counted and reported; the soak goes on
            counts["failed"] += 1
            print(f"reshard failed: {exc}", file=sys.stderr)


async def run_soak(aws: LocalAws, stream: str, out: Path, settings: SoakSettings) -> SoakResult:
    """The soak against running emulators; ``stream`` must not exist yet."""
    s = settings
    async with fault_front(aws, s.faults, s.fault_latency, s.limits, s.seed) as (front, proxy):
        result = await _soak(aws, front, stream, out, settings)
    if proxy is None:
        return result
    answers = dict(proxy.limits.answers) if proxy.limits is not None else {}
    return attrs.evolve(result, faults=dict(proxy.injected), limit_answers=answers)


async def _soak(
    aws: LocalAws, front: LocalAws, stream: str, out: Path, settings: SoakSettings
) -> SoakResult:
    """The soak; the workers reach the emulators at ``front``, the producer at ``aws``."""
    rng = random.Random(settings.seed)
    t0 = time.monotonic()
    fleet = Fleet(front, stream, out, settings.failover, t0)
    actions: Counter[str] = Counter()
    reshards: Counter[str] = Counter()
    deliveries = Deliveries(out)
    options = aws.client_options()
    async with options.create_client("kinesis") as kin:
        client = KinesisStreamClient(kin)
        await client.create_stream(stream, settings.shards)
        try:
            for i in range(settings.workers):
                fleet.start(long_lived=i < settings.long_lived)
            producer = Producer(client, stream, settings.rate)
            producing = asyncio.create_task(producer.run(fleet.now))
            # Chaos starts once every first worker is consuming (or after WARMUP_LIMIT).
            warm_until = fleet.now() + WARMUP_LIMIT
            while fleet.now() < warm_until and any(
                w.first_delivery is None for w in fleet.workers.values()
            ):
                fleet.note_deliveries()
                await asyncio.sleep(0.5)
            warmup = fleet.now()
            until = fleet.now() + settings.seconds
            tasks = [asyncio.create_task(_chaos(fleet, settings, rng, until, actions))]
            if settings.reshard_every:
                tasks.append(
                    asyncio.create_task(
                        _reshard(
                            client,
                            stream,
                            random.Random(settings.seed + 1),
                            settings.reshard_every,
                            until,
                            fleet.now,
                            reshards,
                            settings.max_shards,
                        )
                    )
                )
            next_sample = 0.0
            while not all(t.done() for t in tasks) or fleet.now() < until:
                if fleet.now() >= next_sample:
                    fleet.sample_all()
                    next_sample = fleet.now() + SAMPLE_EVERY
                fleet.note_deliveries()
                deliveries.poll()
                await asyncio.wait(tasks, timeout=1.0)
            producer.stop()
            await producing
            for t in tasks:
                t.result()  # re-raise a crash of the producer or chaos loop
            drain_start = fleet.now()
            acked = set(producer.acked)
            deadline = drain_start + settings.drain_timeout
            while fleet.now() < deadline:
                deliveries.poll()
                if acked <= deliveries.ids:
                    break
                await asyncio.sleep(0.5)
            drain = fleet.now() - drain_start
            await asyncio.sleep(1.0)  # let in-flight batches land before the last count
            fleet.sample_all()
        finally:
            await fleet.shutdown()
    deliveries.poll()
    duplicates: Counter[str] = Counter()
    unexplained: list[dict[str, Any]] = []
    lost_leases = fleet.lost_leases()
    for (shard, seq), workers in deliveries.by_record.items():
        if len(workers) > 1:
            cause = attribute(fleet, shard, workers, lost_leases, bool(settings.faults))
            duplicates[cause] += len(workers) - 1
            if cause in ("planned_move", "none") and len(unexplained) < 10:
                events = [e for e in fleet.events if e[1] in workers]
                unexplained.append(
                    {"shard": shard, "sequence": seq, "workers": workers, "events": events}
                )
    figures = tuple(
        ProcessFigures(w.worker_id, w.samples[0], w.samples[-1])
        for w in fleet.workers.values()
        if w.long_lived and len(w.samples) >= 2
    )
    return SoakResult(
        seconds=settings.seconds,
        produced=len(acked),
        processed=deliveries.count,
        lost=tuple(sorted(acked - deliveries.ids)),
        duplicates=dict(duplicates),
        actions=dict(actions),
        reshards=dict(reshards),
        processes=figures,
        drain_seconds=drain,
        warmup_seconds=warmup,
        producer_retries=producer.errors,
        unexplained=tuple(unexplained),
    )


# -- the command ---------------------------------------------------------------------------


def _print(result: SoakResult) -> None:
    d = result.as_dict()
    print(f"soak {d['seconds']}s: produced {d['produced']}, deliveries {d['processed']}, ", end="")
    print(f"lost {d['lost']}, warm-up {d['warmup_seconds']}s, drain {d['drain_seconds']}s")
    print(f"chaos actions: {d['actions']}  reshards: {d['reshards']}")
    print(f"duplicates by cause: {d['duplicates']}")
    if d["faults"] or d["limit_answers"]:
        print(f"faults injected: {d['faults']}  limit answers: {d['limit_answers']}")
    for p in d["processes"]:
        flag = "  GREW" if p["grew"] else ""
        print(
            f"  {p['worker']}: {p['lived_s']}s  RSS {p['rss_mib'][0]} -> {p['rss_mib'][1]} MiB"
            f"  fds {p['fds'][0]} -> {p['fds'][1]}{flag}"
        )
    print("OK" if result.ok else "FAILED")


async def _main(args: argparse.Namespace) -> SoakResult:
    settings = SoakSettings(
        seconds=args.seconds,
        workers=args.workers,
        long_lived=args.long_lived,
        shards=args.shards,
        rate=args.rate,
        failover=args.failover,
        seed=args.seed,
        reshard_every=args.reshard_every if args.kinesis_local else None,
        faults=args.faults,
        fault_latency=args.fault_latency,
        limits=args.limits,
    )
    with contextlib.ExitStack() as stack:
        aws = stack.enter_context(moto_process())
        if args.kinesis_local:
            script = find_kinesis_local(str(ROOT))
            aws = stack.enter_context(kinesis_local(aws, script=script))
        if args.keep:
            out = Path(args.keep)
            os.makedirs(out, exist_ok=True)
        else:
            out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-")))
        return await run_soak(aws, f"soak-{args.seed}", out, settings)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--workers", type=int, default=5)
    p.add_argument("--long-lived", type=int, default=2)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--rate", type=float, default=None, help="records/s (moto 150, kl 40)")
    p.add_argument("--failover", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kinesis-local", action="store_true", help="stream on kinesis-local")
    p.add_argument("--reshard-every", type=float, default=30.0)
    p.add_argument(
        "--faults", type=float, default=0.0, help="share of requests failed by the fault proxy"
    )
    p.add_argument(
        "--fault-latency", type=float, default=0.0, help="share of requests delayed by 0-2 s"
    )
    p.add_argument("--limits", action="store_true", help="enforce the Kinesis limits")
    p.add_argument("--json", action="store_true")
    p.add_argument("--keep", metavar="DIR", help="keep the workers' output and logs in DIR")
    args = p.parse_args(argv)
    if args.workers < 2 or args.long_lived >= args.workers:
        p.error("--workers must be at least 2 and more than --long-lived")
    if args.rate is None:
        args.rate = 40.0 if args.kinesis_local else 150.0
    result = asyncio.run(_main(args))
    if args.json:
        print(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2).decode())
    else:
        _print(result)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
