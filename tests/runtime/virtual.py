"""Run a runtime test on the virtual-time loop: protocol waits take no real time."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from kclasync._simulation.clock import run_virtual

#: Real seconds a virtual-time test may take before it is stopped as a runaway.
WALL_LIMIT = 60.0


def in_virtual_time(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    """Turn ``async def test_x()`` into a plain test that runs it on a ``VirtualTimeLoop``."""

    def run() -> None:
        run_virtual(test, wall_limit=WALL_LIMIT)

    run.__name__ = test.__name__
    run.__doc__ = test.__doc__
    return run
