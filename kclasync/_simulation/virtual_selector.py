"""The virtual-time loop's clock and selector (``clock.VirtualTimeLoop`` uses them).

``_VirtualSelector`` polls real I/O without blocking; where a real selector would wait for the
next timer it moves the ``VirtualClock`` to it instead (or declares a ``Deadlock``). It also
keeps the optional wall-time guard of ``clock.run_virtual``.

Owns: the clock, the selector's poll-or-advance decision, the two errors a run can end with.
Must not: read the wall clock for anything but the ``wall_limit`` guard.
"""

from __future__ import annotations

import math
import selectors
import time
from collections.abc import Callable, Mapping
from typing import Any


class Deadlock(RuntimeError):
    """Every task waits for something that no timer or ready callback can bring."""


class WallTimeExceeded(RuntimeError):
    """A run took longer in real time than its ``wall_limit`` (a runaway or a busy loop)."""


class _VirtualSelector(selectors.BaseSelector):
    """Polls a real selector without blocking; a would-be wait advances the virtual clock."""

    def __init__(
        self,
        clock: VirtualClock,
        wall_limit: float | None,
        next_timer: Callable[[], float | None],
        busy: Callable[[], bool],
    ) -> None:
        self._inner = selectors.DefaultSelector()
        self._clock = clock
        self._next_timer = next_timer
        self._busy = busy
        self._deadline = None if wall_limit is None else time.monotonic() + wall_limit
        self._polls = 0
        #: Files registered by the loop itself (its self-pipe), set by ``VirtualTimeLoop``.
        self.own_files = 0
        #: Files registered now (kept here: the idle turn asks at every timer).
        self._files = 0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = self._inner.register(fileobj, events, data)
        self._files += 1
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        key = self._inner.unregister(fileobj)
        self._files -= 1
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        return self.poll_or_advance(self._busy(), timeout, self._next_timer())

    def poll_or_advance(
        self, busy: bool, timeout: float | None, next_timer: float | None
    ) -> list[tuple[selectors.SelectorKey, int]]:
        """What ``select`` does, for a loop that knows whether it is busy (callbacks ready)
        and when its first timer is due (``next_timer``; None: no timer)."""
        if busy:
            return self.poll_busy()
        self._count_turn()
        # Real I/O is polled every 64th turn, and before the clock moves whenever a file
        # other than the loop's self-pipe is registered: a poll per turn was a system call
        # per timer, ~5 % of a large simulation. The self-pipe needs no poll before the clock
        # moves: ``call_soon_threadsafe`` queues its callback (making the loop busy) before
        # it writes the byte that would only wake a waiting loop, and this loop never waits.
        # Before a Deadlock is declared, always.
        poll = not self._polls & 0x3F or timeout is None or self._files > self.own_files
        events = self._inner.select(0) if poll else []
        if events:
            return events
        if timeout is None:
            raise Deadlock(
                "virtual-time loop: no task is ready and no timer is scheduled "
                f"(virtual time {self._clock.now:.3f}s)"
            )
        # Move just past the next timer's deadline (timers fire once the clock has passed
        # them; see VirtualTimeLoop). Computing ``now + (when - now)`` instead can land one
        # float step short, and code that then sleeps the remaining step would spin.
        when = next_timer
        if when is None or when - self._clock.now > timeout:
            self._clock.advance(timeout)  # a capped select timeout; the loop asks again
        else:
            self._clock.advance_to(math.nextafter(max(when, self._clock.now), math.inf))
        return []

    def poll_busy(self) -> list[tuple[selectors.SelectorKey, int]]:
        """``poll_or_advance`` for a busy loop: the clock stays, real I/O is polled every
        64th turn."""
        self._count_turn()
        return [] if self._polls & 0x3F else self._inner.select(0)

    def _count_turn(self) -> None:
        """Count a loop turn, and every 4096th check the wall-time limit."""
        self._polls += 1
        if (
            self._deadline is not None
            and not self._polls & 0xFFF
            and time.monotonic() > self._deadline
        ):
            raise WallTimeExceeded(
                f"virtual-time loop: wall-time limit exceeded at virtual {self._clock.now:.1f}s"
            )

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()


class VirtualClock:
    """Seconds of virtual time; only moves forward."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self.now += seconds

    def advance_to(self, when: float) -> None:
        self.now = max(self.now, when)


__all__ = ["Deadlock", "VirtualClock", "WallTimeExceeded"]
