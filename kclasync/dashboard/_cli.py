"""``kclasync dashboard``: serve the live dashboard of one application.

Owns: the command's arguments and the standalone server's life (bind, print the address, run
until interrupted). Must not: contain the view or the routes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from aiohttp import web

from kclasync._adapters.aws import ClientOptions
from kclasync._observations import RecordingError, RecordingWriter, read_recording
from kclasync.dashboard._aiohttp import aiohttp_app
from kclasync.dashboard._hub import Dashboard

DEFAULT_PORT = 8765


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "dashboard",
        help="serve a live web page of an application's leases, workers and leader",
        description=(
            "Serve a web page that shows, live, every lease (owner, checkpoint, lag, "
            "throughput, sticky state, lineage), every worker, the leader and recent "
            "ownership changes, with charts and a lease-ownership timeline over the last "
            "minutes. Read-only. --record FILE also writes what it observes as JSON lines; "
            "--replay FILE shows such a recording (from --record, `kclasync demo` or "
            "`kclasync simulate --record`) instead of a live fleet."
        ),
    )
    p.add_argument(
        "--application", "-a", help="application (lease table) name (required unless --replay)"
    )
    p.add_argument("--table", help="lease table name, if not the application name")
    p.add_argument("--endpoint-url", help="DynamoDB endpoint (for local emulators)")
    p.add_argument("--region", help="AWS region")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port, 0 for any free one ({DEFAULT_PORT})"
    )
    p.add_argument(
        "--metrics",
        action="append",
        default=[],
        metavar="URL",
        help="a worker's Prometheus endpoint, for lag and rates (repeatable)",
    )
    p.add_argument("--interval", type=float, default=1.0, help="seconds between reads (1)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--record",
        metavar="FILE",
        help="also write ownership changes and per-worker rates to FILE (JSON lines), reading "
        "the fleet even while no page is open",
    )
    mode.add_argument(
        "--replay", metavar="FILE", help="show a recording instead of reading a fleet"
    )


def _dashboard(args: argparse.Namespace) -> Dashboard:
    """The dashboard the arguments ask for; ``RecordingError``/``OSError`` for a bad file."""
    if args.replay:
        recording = read_recording(args.replay)
        return Dashboard(recording.application or "recording", replay=recording)
    options = ClientOptions(endpoint_url=args.endpoint_url, region_name=args.region)
    writer = RecordingWriter(args.record, args.application, "dashboard") if args.record else None
    return Dashboard(
        args.application,
        client_options=options,
        table=args.table,
        metrics_urls=args.metrics,
        interval=args.interval,
        record=writer,
    )


async def serve(args: argparse.Namespace) -> int:
    try:
        dashboard = _dashboard(args)
    except (OSError, RecordingError) as exc:
        print(f"kclasync dashboard: error: {exc}", file=sys.stderr)
        return 1
    app = aiohttp_app(dashboard)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, args.host, args.port)
        try:
            await site.start()
        except OSError as exc:
            print(f"cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
            return 1
        host, port = runner.addresses[0][:2]
        shown = f"[{host}]" if ":" in host else host
        what = f"replay of {args.replay}" if args.replay else f"for {args.application}"
        print(f"kclasync dashboard {what}: http://{shown}:{port}/", flush=True)
        if args.record:
            print(f"recording to {args.record}", flush=True)
            async with dashboard.listen():  # reads on while no page is open
                await stop.wait()
        else:
            await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        await runner.cleanup()
    return 0


def run(args: argparse.Namespace) -> int:
    if not args.application and not args.replay:
        print(
            "kclasync dashboard: error: --application is required (or --replay FILE)",
            file=sys.stderr,
        )
        return 2
    if args.interval <= 0:
        print(f"--interval must be positive, got {args.interval}", file=sys.stderr)
        return 2
    return asyncio.run(serve(args))
