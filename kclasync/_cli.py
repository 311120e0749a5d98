"""The ``kclasync`` command line: its subcommands, and one line on stderr (exit code 1) for an
expected failure (``_cli_errors`` words it; ``--verbose`` adds the traceback).

Must not: hold what a command does (the modules it dispatches to do).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import traceback
from collections.abc import Sequence

from kclasync._adapters.aws import ClientOptions
from kclasync._cli_errors import Target, explain
from kclasync._simulation import cli as simulation_cli
from kclasync.dashboard import _cli as dashboard_cli
from kclasync.logging import configure_logging


def _leases_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("leases", help="print an application's lease table")
    p.add_argument("--application", "-a", required=True, help="application (lease table) name")
    p.add_argument("--table", help="lease table name, if not the application name")
    p.add_argument("--endpoint-url", help="DynamoDB endpoint (for local emulators)")
    p.add_argument("--region", help="AWS region")


def _workers_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("workers", help="print each worker's metrics, throughput and lease count")
    p.add_argument("--application", "-a", required=True, help="application (lease table) name")
    p.add_argument("--table", help="lease table name, if not the application name")
    p.add_argument("--endpoint-url", help="DynamoDB endpoint (for local emulators)")
    p.add_argument("--region", help="AWS region")


def _sticky_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sticky",
        help="pin, release or unpin a lease (its Sticky attribute)",
        description="Pin a lease (Sticky=10), release it (20: nobody takes it), or unpin it.",
    )
    p.add_argument("action", choices=["pin", "release", "unpin"])
    p.add_argument("lease", help="lease key (the shard id, in single-stream mode)")
    p.add_argument("--application", "-a", required=True, help="application (lease table) name")
    p.add_argument("--worker", help="with pin: the worker the lease is pinned to")
    p.add_argument("--table", help="lease table name, if not the application name")
    p.add_argument("--endpoint-url", help="DynamoDB endpoint (for local emulators)")
    p.add_argument("--region", help="AWS region")


def _demo_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="run a fleet, a producer and a crash on an in-process AWS emulator",
        description=(
            "Start an AWS emulator (moto) in this process, write a backlog to a stream, run "
            "several workers that share its shards through the lease table while a producer "
            "writes on, crash one worker midway (its leases expire and are taken over), and "
            "account for every record at the end. Needs nothing installed but kclasync[demo]."
        ),
    )
    p.add_argument("--shards", type=int, default=4, help="shards in the demo stream (4)")
    p.add_argument("--workers", type=int, default=3, help="workers sharing the stream (3)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of producing (30)")
    p.add_argument("--rate", type=int, default=400, help="records produced per second (400)")
    p.add_argument(
        "--backlog", type=int, default=20000, help="records written before start (20000)"
    )
    p.add_argument("--failover", type=float, default=3.0, help="lease failover time, s (3)")
    p.add_argument("--record-size", type=int, default=0, help="filler bytes per record (0)")
    p.add_argument("--no-crash", action="store_true", help="do not crash a worker midway")
    p.add_argument("--plain", action="store_true", help="no screen redraws, just lines")
    p.add_argument(
        "--record",
        metavar="FILE",
        default="kclasync-demo.jsonl",
        help="record the run for `kclasync dashboard --replay FILE` (kclasync-demo.jsonl)",
    )
    p.add_argument("--no-record", action="store_true", help="do not record the run")
    p.add_argument(
        "--verbose", "-v", action="store_true", help="log what the workers do; tracebacks"
    )


def _multilang_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "multilang",
        help="run a MultiLangDaemon properties file (record processors as child processes)",
        description="A drop-in for the Java KCL's MultiLangDaemon: the same properties file "
        "and record-processor programs, one child process per held shard.",
    )
    p.add_argument("properties", nargs="?", metavar="FILE", help="the properties file")
    p.add_argument(
        "--properties-file",
        "-p",
        dest="properties_option",
        metavar="FILE",
        help="the properties file",
    )


def _common_options(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Options every command has (added to each subcommand, so a new one gets them too)."""
    for p in sub.choices.values():
        known = {opt for action in p._actions for opt in action.option_strings}
        if "--verbose" not in known:
            p.add_argument(
                "--verbose", "-v", action="store_true", help="on failure, show the traceback"
            )
        if "--log-format" not in known:
            p.add_argument(
                "--log-format",
                choices=("text", "json"),
                default="text",
                help="log lines as text or one JSON object each (text)",
            )


class _HelpFormatter(argparse.HelpFormatter):
    """Wide enough that every command's help stays on one line: subcommands are listed one
    indent deeper than argparse measures them, so their width is counted at that indent."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=24, width=100)

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if action.help is argparse.SUPPRESS or not isinstance(action, argparse._SubParsersAction):
            return
        for sub in action._get_subactions():
            length = len(self._format_action_invocation(sub)) + self._current_indent + 2
            self._action_max_length = max(self._action_max_length, length)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kclasync",
        description="Consume Amazon Kinesis with the KCL lease protocol, from asyncio.",
        formatter_class=_HelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _demo_parser(sub)
    _leases_parser(sub)
    _sticky_parser(sub)
    simulation_cli.add_parser(sub)
    dashboard_cli.add_parser(sub)
    _workers_parser(sub)
    _multilang_parser(sub)
    _common_options(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    verbose = bool(getattr(args, "verbose", False))
    configure_logging(
        json=getattr(args, "log_format", "text") == "json",
        level=logging.INFO if verbose else logging.WARNING,
    )
    try:
        return _dispatch(parser, args)
    except KeyboardInterrupt:
        print("kclasync: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        target = Target(
            table=getattr(args, "table", None) or getattr(args, "application", None),
            region=getattr(args, "region", None),
            endpoint_url=getattr(args, "endpoint_url", None),
        )
        message = explain(exc, target)
        if message is None:
            raise  # not an expected failure: a bug, with its traceback
        if verbose:
            traceback.print_exc(file=sys.stderr)
        print(f"kclasync {args.command}: error: {message}", file=sys.stderr)
        return 1


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "simulate":
        return simulation_cli.run(args)
    if args.command == "dashboard":
        return dashboard_cli.run(args)
    if args.command == "multilang":
        from kclasync.multilang.cli import run as multilang_run

        return multilang_run(parser, args)
    if args.command == "demo":
        from kclasync._demo import DemoSettings, run_demo
        from kclasync.testing.emulators import require_moto

        require_moto("kclasync demo")
        # The embedded emulator's request log and its internal errors (it occasionally answers
        # 500 under concurrent use; the workers retry) are noise here.
        logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
        if not args.verbose:
            logging.getLogger().setLevel(logging.ERROR)
        try:
            settings = DemoSettings(
                shards=args.shards,
                workers=args.workers,
                duration=args.duration,
                rate=args.rate,
                backlog=args.backlog,
                failover=args.failover,
                record_size=args.record_size,
                crash=not args.no_crash,
                live=(not args.plain) and sys.stdout.isatty(),
                record=None if args.no_record else args.record,
            )
        except ValueError as exc:
            parser.error(str(exc))
        return asyncio.run(run_demo(settings))
    if args.command == "leases":
        from kclasync._lease_view import print_lease_table

        options = ClientOptions(endpoint_url=args.endpoint_url, region_name=args.region)
        return asyncio.run(print_lease_table(options, args.table or args.application))
    if args.command == "workers":
        from kclasync._worker_view import print_workers

        options = ClientOptions(endpoint_url=args.endpoint_url, region_name=args.region)
        return asyncio.run(print_workers(options, args.table or args.application))
    if args.command == "sticky":
        if args.worker and args.action != "pin":
            parser.error("--worker goes with pin")
        from kclasync._lease_view import set_sticky

        options = ClientOptions(endpoint_url=args.endpoint_url, region_name=args.region)
        value = {"pin": 10, "release": 20, "unpin": None}[args.action]
        return asyncio.run(
            set_sticky(options, args.table or args.application, args.lease, value, args.worker)
        )
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
