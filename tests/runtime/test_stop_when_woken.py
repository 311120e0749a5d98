"""A graceful stop that lands while a loop of the worker is being woken still stops the worker.

The taker, the assignment discovery, the leader duties and a shard's child-lease retry wait for
"an event, or a timeout". On Python 3.11, ``asyncio.wait_for(event.wait(), delay)`` returns the
event's result when the cancellation arrives after the event was set but before the waiting task
ran again: the cancellation is lost, the loop goes round once more and waits again, and the
worker's stop waits for it forever. A worker whose taker is woken by a peer that just left the
registry (early failover's heartbeat watch) while it is itself being stopped then never stops: a
two-worker end-to-end test hung this way on a loaded machine (the loop steps between the wake-up
and the cancellation are further apart there, and the coincidence more likely).

Here the coincidence is made on purpose, on the virtual-time loop: the wake-up is sent 0 to
``STEPS`` loop steps before the stop, so one of them lands in the window whatever the exact
number of steps between a wake-up and the waiting task's resumption is.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import pathlib
from collections.abc import Callable, Sequence

from kclasync import Consumer
from kclasync._adapters.memory import MemoryLeaseTable, MemoryStreamClient
from kclasync._records import Record
from kclasync._runtime.worker import Worker
from tests.runtime.test_early_failover import consumer
from tests.runtime.virtual import in_virtual_time
from tests.support import wait_until

STREAM = "s"
#: Loop steps between the wake-up and the stop tried (the window is 2-3 steps wide today).
STEPS = 8
#: Virtual seconds a stop may take: the pipelines' shutdown, the releases, leaving the registry.
STOP_LIMIT = 60.0


async def ignore(records: Sequence[Record]) -> None:
    return None


def worker_of(c: Consumer) -> Worker:
    assert c._worker is not None
    return c._worker


def taker_wake(c: Consumer) -> None:
    worker_of(c)._taker_wake.set()


def duties_wake(c: Consumer) -> None:
    """What the elector does when this worker becomes leader: wake the leader duties."""
    wakers = worker_of(c).elector._wakers
    assert wakers, "the leader duties subscribe to the elector's new terms"
    for event in wakers:
        event.set()


async def stops_in_time(wake: Callable[[Consumer], None], steps: int, **cfg: object) -> bool:
    """Start a worker, wake one of its loops ``steps`` loop steps before asking it to stop, and
    say whether the stop finished within ``STOP_LIMIT``."""
    client = MemoryStreamClient()
    client.create_stream(STREAM, 2)
    table = MemoryLeaseTable()
    c = consumer(table, client, "a", **cfg)
    task = asyncio.create_task(c.run())
    await wait_until(lambda: len(c.held_leases) == 2, 120, "both leases held")
    # Let the loops settle into their waits (a taking round, the duties' first pass).
    await asyncio.sleep(5.0)
    wake(c)
    for _ in range(steps):
        await asyncio.sleep(0)
    await c.stop()
    done, _ = await asyncio.wait({task}, timeout=STOP_LIMIT)
    if done:
        task.result()
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False


async def stop_right_after(wake: Callable[[Consumer], None], **cfg: object) -> list[int]:
    """The offsets (loop steps between the wake-up and the stop) at which the stop hung."""
    return [steps for steps in range(STEPS + 1) if not await stops_in_time(wake, steps, **cfg)]


@in_virtual_time
async def test_stop_while_the_taker_is_woken_stops_the_worker() -> None:
    hung = await stop_right_after(taker_wake)
    assert hung == [], f"the worker did not stop when woken {hung} loop steps before its stop"


@in_virtual_time
async def test_stop_while_the_assignment_discovery_is_woken_stops_the_worker() -> None:
    hung = await stop_right_after(taker_wake, lease_taker="kcl3")
    assert hung == [], f"the worker did not stop when woken {hung} loop steps before its stop"


@in_virtual_time
async def test_stop_while_the_leader_duties_are_woken_stops_the_worker() -> None:
    hung = await stop_right_after(duties_wake)
    assert hung == [], f"the worker did not stop when woken {hung} loop steps before its stop"


def _event_waits_under_wait_for(source: str) -> list[int]:
    """Lines of ``asyncio.wait_for(<x>.wait(), ...)`` calls in ``source``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func, first = node.func, node.args[0]
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "wait_for"
            and isinstance(first, ast.Call)
            and isinstance(first.func, ast.Attribute)
            and first.func.attr == "wait"
        ):
            lines.append(node.lineno)
    return lines


def test_no_loop_waits_for_an_event_through_wait_for() -> None:
    """The tests above cover the loops there are today; a new one written the same way would
    lose a stop too. ``async with asyncio.timeout(delay): await event.wait()`` does not."""
    root = pathlib.Path(__file__).resolve().parents[2] / "kclasync"
    found = {
        str(path.relative_to(root.parent)): lines
        for path in sorted(root.rglob("*.py"))
        if (lines := _event_waits_under_wait_for(path.read_text()))
    }
    assert found == {}
    assert _event_waits_under_wait_for("await asyncio.wait_for(wake.wait(), 1)") == [1]
