"""The runtime's one way to wait for an event with a time limit.

Every periodic loop of a worker (lease taking, assignment discovery, the leader lock, the
leader's duties, a shard's wait for its children) sleeps until its next due time unless an
event wakes it first. They all wait through ``wait_event``.

Owns: the bounded wait itself, with ``asyncio.timeout`` and not ``asyncio.wait_for``: on Python
3.11 ``wait_for`` can swallow a cancellation that arrives as the event is set, and a worker
that is being stopped would then go on running.
Must not: read a clock (the event loop's timer does the counting, so virtual time works) or
clear the event (whether a wake-up is consumed is the caller's business).
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["wait_event"]


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds have passed; True if it is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()
    return event.is_set()
