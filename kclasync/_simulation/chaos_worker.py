"""One worker process for the multi-process chaos test (``tests/simulation/test_chaos.py``).

``python -m kclasync._simulation.chaos_worker --endpoint-url URL --stream S --worker-id ID
--out FILE`` consumes the stream with a plain handler that appends one line per record
(``<record id> <shard> <sequence> <worker id>``) to FILE before the batch is checkpointed, so the
file shows every record this process processed even if it is killed with SIGKILL. SIGTERM stops
it gracefully (``Consumer.stop()``).

Owns: nothing the library uses. Must not: be imported by the runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Sequence

import orjson

from kclasync import Consumer, ConsumerConfig
from kclasync._records import Record
from kclasync._runtime.worker import Worker
from kclasync.testing.emulators import LocalAws


async def _main(args: argparse.Namespace) -> None:
    if args.log_warnings:
        # On stderr, for whoever started this process to attribute duplicates (lost leases).
        logging.basicConfig(
            level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    async def handle(records: Sequence[Record]) -> None:
        lines = b"".join(
            b"%d %s %s %s\n"
            % (
                int(orjson.loads(r.data)["id"]),
                r.shard_id.encode(),
                r.sequence_number.encode(),
                args.worker_id.encode(),
            )
            for r in records
        )
        os.write(fd, lines)

    consumer = Consumer(
        stream_name=args.stream,
        application_name=args.stream,
        processor=handle,
        config=ConsumerConfig(
            failover_time=args.failover,
            initial_position="TRIM_HORIZON",
            idle_time_between_reads=0.2,
            min_time_between_reads=0.0,
            shard_sync_interval=5.0,
            parent_shard_poll_interval=0.5,
            shutdown_timeout=10.0,
            worker_id=args.worker_id,
            early_failover=not args.no_early_failover,
        ),
        client_options=LocalAws(args.endpoint_url, args.kinesis_endpoint_url).client_options(),
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: loop.create_task(consumer.stop()))
    stats = loop.create_task(_write_stats(consumer, args.stats)) if args.stats else None
    try:
        await consumer.run()
    finally:
        os.close(fd)
        if stats is not None:
            stats.cancel()


def _inner(worker: Worker | None, part: str) -> object:
    """The backend's adapter under one of the worker's retry wrappers (None before it runs)."""
    return getattr(getattr(worker, part, None), "inner", None)


async def _write_stats(consumer: Consumer, path: str) -> None:
    """Every half second, replace ``path`` with this process's table calls so far (JSON), for
    the failover benchmark's read counts; a SIGKILL loses at most the last half second."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        await asyncio.sleep(0.5)
        worker = consumer._worker
        early = worker.early_failover if worker is not None else None
        figures = {
            "seconds": loop.time() - started,
            "lease_table": dict(getattr(_inner(worker, "store"), "calls", {})),
            "registry": dict(getattr(_inner(worker, "registry"), "calls", {})),
            "taker_rounds": worker.coordinator.taking.rounds if worker is not None else 0,
            "index_items": early.index_reads if early is not None else 0,
            "early_reads": early.lease_reads if early is not None else 0,
            "early_takes": early.early_takes if early is not None else 0,
            "silences": early.silences if early is not None else 0,
            "skipped_silences": early.skipped_silences if early is not None else 0,
            "index_queries": early.index_queries if early is not None else 0,
            "reads_by_outcome": dict(early.reads_by_outcome) if early is not None else {},
            "follows_by_outcome": dict(early.follows_by_outcome) if early is not None else {},
            "round_causes": (
                dict(worker.coordinator.taking.round_causes) if worker is not None else {}
            ),
        }
        _replace_file(path, orjson.dumps(figures))


def _replace_file(path: str, data: bytes) -> None:
    """Write ``path`` whole (a tiny local file: a write and a rename, no waiting on I/O)."""
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(path + ".tmp", path)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--endpoint-url", required=True)
    p.add_argument("--kinesis-endpoint-url", help="Kinesis elsewhere (e.g. kinesis-local)")
    p.add_argument("--stream", required=True)
    p.add_argument("--worker-id", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--failover", type=float, default=2.0)
    p.add_argument("--log-warnings", action="store_true", help="log warnings to stderr")
    p.add_argument("--stats", help="write table call counts to this file every second")
    p.add_argument(
        "--no-early-failover", action="store_true", help="early_failover=False (the scans only)"
    )
    asyncio.run(_main(p.parse_args(argv)))


if __name__ == "__main__":
    main()
