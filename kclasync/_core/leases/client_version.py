"""The Java KCL 3.x migration state (item ``Migration3.0`` in ``<app>-CoordinatorState``) and
what kclasync does in each client version.

Owns: decoding the item's client version (``cv``) tolerantly, and the one decision made from it:
whether the Java workers of the fleet follow a leader's assignment (KCL 3.x) or take leases
themselves (KCL 2.x compatible), and so how a kclasync worker spreads leases (``lease_mode``):
in a fleet whose Java workers follow a leader, every kclasync worker runs the leader-assigned
behaviour whatever its configured lease taker, so that a kclasync leader assigns the Java
workers their share and no kclasync follower takes leases behind the Java leader's back.
kclasync only reads the item: the Java migration state machine owns it.
Must not: do I/O, or ever produce a write to the item.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from kclasync._core.workers.java_liveness import Verdict

MIGRATION_KEY = "Migration3.0"
CLIENT_VERSION = "cv"
MODIFIED_BY = "mb"


class ClientVersion(enum.Enum):
    """The KCL 3.x client versions."""

    INIT = "CLIENT_VERSION_INIT"
    V2X = "CLIENT_VERSION_2X"
    UPGRADE_FROM_2X = "CLIENT_VERSION_UPGRADE_FROM_2X"
    V3X_WITH_ROLLBACK = "CLIENT_VERSION_3X_WITH_ROLLBACK"
    V3X = "CLIENT_VERSION_3X"


@attrs.frozen
class MigrationState:
    #: None: the item names a version this release does not know.
    version: ClientVersion | None
    raw: str
    modified_by: str | None = None


def decode_migration_item(item: dict[str, Any] | None) -> MigrationState | None:
    """The state in a ``Migration3.0`` item (None: no item, i.e. no Java 3.x worker ran)."""
    if item is None:
        return None
    attr = item.get(CLIENT_VERSION)
    raw = attr.get("S") if isinstance(attr, dict) else None
    if not isinstance(raw, str):
        return MigrationState(None, repr(attr))
    by = item.get(MODIFIED_BY)
    modified_by = by.get("S") if isinstance(by, dict) else None
    try:
        version: ClientVersion | None = ClientVersion(raw)
    except ValueError:
        version = None
    return MigrationState(version, raw, modified_by if isinstance(modified_by, str) else None)


#: Versions in which Java workers take leases themselves (the KCL 2.x algorithm).
WORKER_TAKES = frozenset({ClientVersion.V2X, ClientVersion.UPGRADE_FROM_2X})
#: Versions in which Java workers only process what the leader assigned them.
LEADER_ASSIGNS = frozenset({ClientVersion.V3X_WITH_ROLLBACK, ClientVersion.V3X})


def java_fleet_follows_leader(state: MigrationState | None) -> bool | None:
    """True when the Java workers on the table follow a leader's assignment (they never steal),
    False when they take leases themselves, None when unknown (no item, INIT or an unknown
    version: a fresh 3.x fleet moves from INIT to 3X when its first worker starts)."""
    if state is None or state.version is None or state.version is ClientVersion.INIT:
        return None
    return state.version in LEADER_ASSIGNS


@attrs.frozen
class LeaseMode:
    """How a kclasync worker spreads leases, and why."""

    #: True: the leader assigns (the ``kcl3`` behaviour unless ``load`` is configured) and this
    #: worker processes what is assigned to it; False: it takes leases itself.
    leader_assigns: bool
    reason: str


def lease_mode(
    state: MigrationState | None,
    *,
    configured_leader_based: bool,
    java: Verdict = Verdict.ALIVE,
) -> LeaseMode:
    """The lease mode of a kclasync worker on a table in ``state``, with the Java workers'
    liveness as this worker judged it (``core.workers.java_liveness``).

    A configured leader-based taker (``kcl3``, ``load``) always assigns: its leader counts
    every worker that reports to the worker registry, Java ones included. A worker-side taker
    (``balanced``, ``kcl2``) is kept while no Java worker follows a leader (no item, ``INIT``,
    ``2X``, ``UPGRADE_FROM_2X``, an unknown version). In ``3X`` and ``3X_WITH_ROLLBACK`` the
    Java workers only process what a leader assigns, and a kclasync leader that never assigns
    would starve them: while a Java worker lives (or before its liveness can be judged) the
    worker switches to the leader-assigned behaviour; once every Java worker is silent it takes
    leases itself again, rather than wait for a dead Java leader's lock."""
    if configured_leader_based:
        return LeaseMode(True, "the configured lease taker is leader-based")
    if java_fleet_follows_leader(state):
        assert state is not None
        if java is Verdict.SILENT:
            return LeaseMode(
                False,
                f"the Java KCL on this table runs {state.raw}, but no Java worker shows a sign "
                "of life (registry entry or lease counter moving)",
            )
        why = "a Java worker is alive" if java is Verdict.ALIVE else "Java workers may be alive"
        return LeaseMode(
            True,
            f"the Java KCL on this table runs {state.raw} and {why}: its workers only process "
            "what a leader assigns, so a kclasync leader must assign (the kcl3 behaviour)",
        )
    if state is None:
        return LeaseMode(False, "no Java KCL 3.x worker has run on this table")
    return LeaseMode(
        False,
        f"the Java KCL on this table runs {state.raw}: its workers take leases themselves",
    )
