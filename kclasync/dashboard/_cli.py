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

DEFAULT_PORT = 8765


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "dashboard",
        help="serve a live web page of an application's leases, workers and leader",
        description=(
            "Serve a web page that shows, live, every lease (owner, checkpoint, lag, "
            "throughput, sticky state, lineage), every worker, the leader and recent "
            "ownership changes. Read-only."
        ),
    )
    p.add_argument("--application", "-a", required=True, help="application (lease table) name")
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


async def serve(args: argparse.Namespace) -> int:
    from kclasync.dashboard import dashboard_app

    options = ClientOptions(endpoint_url=args.endpoint_url, region_name=args.region)
    app = dashboard_app(
        args.application,
        client_options=options,
        table=args.table,
        metrics_urls=args.metrics,
        interval=args.interval,
    )
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
        print(f"kclasync dashboard for {args.application}: http://{shown}:{port}/", flush=True)
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        await runner.cleanup()
    return 0


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        print(f"--interval must be positive, got {args.interval}", file=sys.stderr)
        return 2
    return asyncio.run(serve(args))
