"""``kclasync demo``: a whole fleet on one machine, with nothing to install.

An in-process AWS emulator (moto) on a free 127.0.0.1 port, a stream, a producer, several workers
sharing the shards through the lease table, a live view of who holds what, one worker crashed
midway without releasing its leases (failover), and a summary that accounts for every record.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TextIO

import attrs
import orjson
from prometheus_client import CollectorRegistry, generate_latest

from kclasync._adapters.aws import ClientOptions
from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync._config import ConsumerConfig
from kclasync._consumer import Consumer
from kclasync._lease_view import render_leases
from kclasync._records import Record
from kclasync.testing.emulators import embedded_moto

if TYPE_CHECKING:
    from kclasync.dashboard._hub import Dashboard

STREAM = "kclasync-demo"
APPLICATION = "kclasync-demo"


_LIMITS = {
    "shards": (1, 50),
    "workers": (1, 20),
    "duration": (2, 3600),
    "rate": (0, 20000),
    "backlog": (0, 1_000_000),
    "failover": (0.5, 60),
    "record_size": (0, 100_000),
}


@attrs.frozen(kw_only=True)
class DemoSettings:
    shards: int = 4
    workers: int = 3
    duration: float = 30.0
    rate: int = 400
    backlog: int = 20000
    failover: float = 3.0
    #: Bytes of filler text in each record, besides its id.
    record_size: int = 0
    crash: bool = True
    live: bool = False
    #: Where to record the run for ``kclasync dashboard --replay`` (None: not recorded).
    record: str | None = None

    def __attrs_post_init__(self) -> None:
        for name, (lo, hi) in _LIMITS.items():
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ValueError(f"--{name} must be between {lo:g} and {hi:g}, got {value:g}")


@attrs.define
class DemoResult:
    produced: int = 0
    consumed: int = 0
    deliveries: int = 0
    duplicates: int = 0
    lost: int = 0
    malformed: int = 0
    failover_seconds: float | None = None
    peak_rate: dict[str, float] = attrs.field(factory=dict)


class _Tally:
    def __init__(self) -> None:
        self.deliveries: Counter[int] = Counter()
        self.by_worker: Counter[str] = Counter()
        self.by_shard: Counter[str] = Counter()
        self.malformed = 0

    def handler_for(self, worker: str) -> Callable[[Sequence[Record]], Awaitable[None]]:
        async def handle(records: Sequence[Record]) -> None:
            for record in records:
                try:
                    self.deliveries[int(orjson.loads(record.data)["id"])] += 1
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    self.malformed += 1
                self.by_shard[record.shard_id] += 1
            self.by_worker[worker] += len(records)

        return handle


class _Producer:
    def __init__(self, client: KinesisStreamClient, record_size: int = 0) -> None:
        self.client = client
        self.next_id = 0
        filler = "kclasync demo record body "
        self.body = (filler * (record_size // len(filler) + 1))[:record_size]

    async def put(self, count: int) -> None:
        """Write ``count`` records, one PutRecords request at a time, retrying failed entries."""
        pending = []
        for _ in range(count):
            i = self.next_id
            self.next_id += 1
            record = {"id": i, "body": self.body} if self.body else {"id": i}
            pending.append((f"user-{i % 997}", orjson.dumps(record)))
        while pending:
            chunk, pending = pending[:500], pending[500:]
            results = await self.client.put_records(STREAM, chunk)
            retry = [entry for entry, res in zip(chunk, results, strict=True) if res is None]
            pending = retry + pending
            if retry:  # throttled entries (over a shard's write limit): back off a little
                await asyncio.sleep(0.1)

    async def steady(self, rate: int, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        sent = 0
        while (now := loop.time()) - start < seconds:
            due = int(rate * (now - start)) - sent
            if due > 0:
                await self.put(due)
                sent += due
            await asyncio.sleep(0.1)


Say = Callable[[str], None]


async def run_demo(
    settings: DemoSettings,
    out: TextIO | None = None,
    *,
    client_overrides: Mapping[str, object] | None = None,
) -> int:
    """Run the demo; ``client_overrides`` go to the emulator's ``client_options`` (e.g. the
    credentials the clients sign with)."""
    stream_out = out if out is not None else sys.stdout

    def say(text: str = "") -> None:
        print(text, file=stream_out, flush=True)

    with embedded_moto() as aws:
        say(f"AWS emulator (moto) listening on {aws.endpoint_url}")
        options = aws.client_options(**(client_overrides or {}))
        result = await _run(settings, options, say)
    say()
    say("Summary")
    say(f"  records produced      {result.produced:>10,}")
    say(f"  records consumed      {result.consumed:>10,}  (distinct)")
    say(f"  deliveries            {result.deliveries:>10,}")
    say(
        f"  duplicates            {result.duplicates:>10,}  (at-least-once: records the crashed "
        "worker processed but had not checkpointed)"
    )
    say(f"  lost                  {result.lost:>10,}")
    if result.malformed:
        say(f"  malformed records     {result.malformed:>10,}")
    if result.failover_seconds is not None:
        say(
            f"  failover              {result.failover_seconds:>9.1f}s  "
            f"= {result.failover_seconds / settings.failover:.2f} x the failover time "
            f"({settings.failover:g}s)"
        )
    for worker, rate in sorted(result.peak_rate.items()):
        say(f"  peak rate {worker:<12}{rate:>10,.0f} records/s")
    ok = result.lost == 0
    say("  result                " + ("OK: every record was processed" if ok else "RECORDS LOST"))
    if settings.record:
        say()
        say(f"The run is recorded in {settings.record}; see its charts and lease timeline with:")
        say(f"  kclasync dashboard --replay {shlex.quote(settings.record)}")
    return 0 if ok else 1


async def _run(
    settings: DemoSettings,
    options: ClientOptions,
    say: Say,
    *,
    consumer_config: Mapping[str, object] | None = None,
) -> DemoResult:
    """The demo's fleet against ``options``' emulator; ``consumer_config`` overrides the
    workers' ``ConsumerConfig`` fields (the tests' read pacing)."""
    tally = _Tally()
    result = DemoResult()
    async with contextlib.AsyncExitStack() as stack:
        kin = await stack.enter_async_context(options.create_client("kinesis"))
        ddb = await stack.enter_async_context(options.create_client("dynamodb"))
        client = KinesisStreamClient(kin)
        await client.create_stream(STREAM, settings.shards)
        producer = _Producer(client, settings.record_size)
        if settings.backlog:
            say(
                f"writing a backlog of {settings.backlog:,} records to {settings.shards} shards ..."
            )
            await producer.put(settings.backlog)
        registry = CollectorRegistry()
        workers = [
            Consumer(
                stream_name=STREAM,
                application_name=APPLICATION,
                processor=tally.handler_for(f"worker-{i}"),
                config=ConsumerConfig(
                    **{  # type: ignore[arg-type]
                        "worker_id": f"worker-{i}",
                        "failover_time": settings.failover,
                        "initial_position": "TRIM_HORIZON",
                        "idle_time_between_reads": 0.2,
                        "min_time_between_reads": 0.0,
                        "shard_sync_interval": 10.0,
                        "shutdown_timeout": 10.0,
                        **(consumer_config or {}),
                    }
                ),
                client_options=options,
                registry=registry,
            )
            for i in range(settings.workers)
        ]
        tasks = [asyncio.create_task(w.run(), name=w.worker_id) for w in workers]
        state = {w.worker_id: "running" for w in workers}
        loop = asyncio.get_running_loop()
        started = loop.time()
        store = DynamoLeaseStore(ddb, APPLICATION)
        view = asyncio.create_task(
            _LiveView(settings, workers, state, tally, producer, store, say, result).run(started)
        )
        recorder = await stack.enter_async_context(_recording(settings, options, registry))
        try:
            producing = asyncio.create_task(producer.steady(settings.rate, settings.duration))
            if settings.crash and settings.workers > 1:
                await asyncio.sleep(settings.duration / 2)
                victim = max(workers, key=lambda w: (len(w.held_leases), w.worker_id))
                orphaned = set(victim.held_leases)
                tasks[workers.index(victim)].cancel()
                state[victim.worker_id] = "crashed"
                crashed_at = loop.time()
                say(
                    f"\n*** {victim.worker_id} crashed holding {len(orphaned)} leases "
                    "(not released: the others must wait for expiry) ***\n"
                )
                survivors = [w for w in workers if w is not victim]
                while orphaned - {k for w in survivors for k in w.held_leases}:
                    await asyncio.sleep(0.05)
                result.failover_seconds = loop.time() - crashed_at
                say(
                    f"\n*** {victim.worker_id}'s leases taken over after "
                    f"{result.failover_seconds:.1f}s ***\n"
                )
            await producing
            produced = set(range(producer.next_id))
            deadline = loop.time() + 60 + 5 * settings.failover
            while not produced <= tally.deliveries.keys() and loop.time() < deadline:
                await asyncio.sleep(0.2)
            if recorder is not None:
                # The recording ends on reads made after the takeover: the dashboard reads once
                # a second, and the run can end sooner than that after the leases moved.
                async with recorder.listen() as queue:
                    for _ in range(3):  # the latest document, then two fresh reads
                        if await recorder.next(queue, 5.0) is None:
                            break
        finally:
            for worker, task in zip(workers, tasks, strict=True):
                if not task.done():
                    await worker.stop()
                    state[worker.worker_id] = "stopped"
            await asyncio.gather(*tasks, return_exceptions=True)
            view.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await view
            if recorder is not None:
                await recorder.close()
        result.produced = producer.next_id
        result.consumed = len(set(range(producer.next_id)) & tally.deliveries.keys())
        result.deliveries = sum(tally.deliveries.values())
        result.duplicates = result.deliveries - len(tally.deliveries)
        result.lost = result.produced - result.consumed
        result.malformed = tally.malformed
        say("\nfinal lease table:")
        scan = await store.list_leases()
        for line in render_leases(scan.leases, processed=tally.by_shard):
            say("  " + line)
    return result


@contextlib.asynccontextmanager
async def _recording(
    settings: DemoSettings, options: ClientOptions, registry: CollectorRegistry
) -> AsyncIterator[Dashboard | None]:
    """With ``settings.record``: a dashboard reading the demo's table and metrics every second
    and writing what it sees to the file, for ``kclasync dashboard --replay``."""
    if not settings.record:
        yield None
        return
    from kclasync._observations import RecordingWriter
    from kclasync.dashboard._hub import Dashboard

    dashboard = Dashboard(
        APPLICATION,
        client_options=options,
        metrics_text=lambda: generate_latest(registry).decode(),
        record=RecordingWriter(settings.record, APPLICATION, "demo"),
    )
    try:
        async with dashboard.listen():  # reads while the demo runs
            yield dashboard
    finally:
        await dashboard.close()


@attrs.define
class _LiveView:
    settings: DemoSettings
    workers: list[Consumer]
    state: dict[str, str]
    tally: _Tally
    producer: _Producer
    store: DynamoLeaseStore
    say: Say
    result: DemoResult

    async def run(self, started: float) -> None:
        loop = asyncio.get_running_loop()
        last = {w.worker_id: (started, 0) for w in self.workers}
        print_every = 1.0 if self.settings.live else 5.0
        next_print = started + print_every
        while True:
            await asyncio.sleep(0.5)
            now = loop.time()
            for w in self.workers:
                count = self.tally.by_worker[w.worker_id]
                t0, c0 = last[w.worker_id]
                if now - t0 >= 1.0:
                    rate = (count - c0) / (now - t0)
                    peak = self.result.peak_rate
                    peak[w.worker_id] = max(peak.get(w.worker_id, 0.0), rate)
                    last[w.worker_id] = (now, count)
            if now >= next_print:
                next_print = now + print_every
                await self._show(now - started)

    async def _show(self, elapsed: float) -> None:
        try:
            scan = await self.store.list_leases()
        except Exception:  # the view must never stop the demo
            return
        tally = self.tally
        lines = [
            f"t={elapsed:6.1f}s  produced={self.producer.next_id:,}  "
            f"consumed={len(tally.deliveries):,}  deliveries={sum(tally.deliveries.values()):,}",
        ]
        for w in self.workers:
            state = self.state[w.worker_id]
            # The table's count: the worker's own view lags a take by up to one renewal.
            owned = sum(1 for lease in scan.leases if lease.owner == w.worker_id)
            holds = (
                f"owns {owned} lease{'' if owned == 1 else 's'} in the table"
                if state == "running"
                else "its leases wait for expiry"
                if state == "crashed"
                else ""
            )
            lines.append(
                f"  {w.worker_id:<10} {state:<8} {holds:<28} "
                f"processed {tally.by_worker[w.worker_id]:,}"
            )
        lines += ["  " + line for line in render_leases(scan.leases, processed=tally.by_shard)]
        if self.settings.live:
            self.say("\x1b[H\x1b[J" + "\n".join(lines))
        else:
            self.say("\n".join(lines))
