"""A lease this worker holds (its local fencing state) and who is told when it changes.

Owns: ``HeldLease`` (the lease as last written, renewal time, lock, state) and the
``LeaseListener`` protocol. The states and their edges are ``kclasync._core.held_lease``'s.
Must not: do I/O or decide anything.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import attrs

from kclasync._core.held_lease import FINAL, Event, HeldState, next_state
from kclasync._core.lease import Lease


@attrs.define(eq=False)
class HeldLease:
    """A lease this worker holds, with the local state that fences its writes."""

    lease: Lease
    #: Loop time at which the last successful counter-changing write was sent.
    renewed_at: float
    lock: asyncio.Lock = attrs.field(factory=asyncio.Lock)
    state: HeldState = HeldState.ACTIVE
    #: Loop time a handoff (either way) started.
    since: float = 0.0
    #: Sticky=20 was seen: the pipeline is stopping and the lease will be released.
    release_requested: bool = False
    #: Record bytes delivered to the processor since the last renewal (for ``throughputKBps``).
    bytes_delivered: int = 0
    #: Loop time the last renewal was sent (None until the first one): the EMA's period start.
    throughput_since: float | None = None
    #: INCOMING from a worker of another implementation (a Java KCL worker): this worker does
    #: not write the lease until the old owner has finished (the old owner renews and makes its
    #: final checkpoint under the lease counter); it only reads it.
    watch_only: bool = False
    #: Loop time the lease counter was last seen moving (the old owner's renewals).
    progress_at: float = 0.0

    @property
    def key(self) -> str:
        return self.lease.key

    @property
    def lost(self) -> bool:
        """No write goes through this handle any more (lost, or let go)."""
        return self.state in FINAL

    def apply(self, event: Event) -> HeldState:
        """Move along one edge of ``kclasync._core.held_lease``; returns the state left."""
        left = self.state
        self.state = next_state(left, event)
        return left


class LeaseListener(Protocol):
    def lease_acquired(self, held: HeldLease) -> None:
        """The lease is ours to process: start its pipeline."""

    def lease_lost(self, held: HeldLease, reason: str) -> None:
        """The lease is gone: stop its pipeline at once."""

    def lease_stop_requested(self, held: HeldLease, reason: str) -> None:
        """Finish the batch in flight, let the processor checkpoint, then call ``release``."""
