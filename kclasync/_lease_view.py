"""Rendering a lease table for people (``kclasync leases`` and the demo's live view)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping

from kclasync._adapters.aws import ClientOptions
from kclasync._adapters.protocols import LeaseScan
from kclasync._core.leases.lease import Lease


def _short(text: str | None, width: int) -> str:
    if text is None:
        return "-"
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def render_leases(
    leases: Iterable[Lease], *, processed: Mapping[str, int] | None = None
) -> list[str]:
    rows = sorted(leases, key=lambda lease: lease.key)
    lines = [
        f"{'lease':<24} {'owner':<22} {'counter':>7} {'checkpoint':<26} {'sticky':>6}"
        + ("  processed" if processed is not None else "")
    ]
    for lease in rows:
        sticky = "-" if lease.sticky is None else str(lease.sticky)
        line = (
            f"{_short(lease.key, 24):<24} {_short(lease.owner, 22):<22} {lease.counter:>7} "
            f"{_short(str(lease.checkpoint), 26):<26} {_short(sticky, 6):>6}"
        )
        if processed is not None:
            line += f"  {processed.get(lease.key, 0):>9}"
        lines.append(line)
    return lines


def render_scan(scan: LeaseScan) -> list[str]:
    lines = render_leases(scan.leases)
    for exc in scan.corrupt:
        lines.append(f"CORRUPT {exc}")
    return lines


async def print_lease_table(options: ClientOptions, table: str) -> int:
    from kclasync._adapters.dynamodb import DynamoLeaseStore

    async with options.create_client("dynamodb") as client:
        # AWS errors (missing table, access denied, ...) are worded by the CLI.
        scan = await DynamoLeaseStore(client, table).list_leases()
    print("\n".join(render_scan(scan)))
    print(f"{len(scan.leases)} leases, {len(scan.corrupt)} corrupt")
    return 0


async def set_sticky(
    options: ClientOptions, table: str, key: str, value: int | None, worker: str | None
) -> int:
    from kclasync._adapters.dynamodb import DynamoLeaseStore

    async with options.create_client("dynamodb") as client:
        store = DynamoLeaseStore(client, table)
        try:
            await store.set_sticky(key, value, worker)
        except KeyError as exc:
            print(f"kclasync sticky: error: {exc.args[0]}", file=sys.stderr)
            return 1
    what = {None: "unpinned (normal)", 10: "pinned (Sticky=10)", 20: "released (Sticky=20)"}
    print(f"{key}: {what[value]}" + (f" to {worker}" if worker else ""))
    return 0
