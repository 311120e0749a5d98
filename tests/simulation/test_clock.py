"""The virtual-time loop: time moves only by jumping to timers, deterministically."""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import random
import socket
import time

import pytest

from kclasync._simulation.clock import Deadlock, VirtualTimeLoop, WallTimeExceeded, run_virtual


def test_hours_of_sleeps_pass_instantly_and_in_order() -> None:
    order: list[tuple[float, str]] = []

    async def sleeper(name: str, delay: float) -> None:
        await asyncio.sleep(delay)
        order.append((asyncio.get_running_loop().time(), name))

    async def main() -> float:
        await asyncio.gather(sleeper("b", 7200.0), sleeper("a", 3600.0), sleeper("c", 0.5))
        return asyncio.get_running_loop().time()

    started = time.monotonic()
    end = run_virtual(main)
    assert time.monotonic() - started < 5
    assert [name for _, name in order] == ["c", "a", "b"]
    assert end == pytest.approx(7200.0)
    assert order[1][0] == pytest.approx(3600.0)


def test_wait_for_timeout_in_virtual_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 30.0)
        return loop.time()

    assert run_virtual(main) == pytest.approx(30.0)


def test_sleeping_the_remaining_float_step_makes_progress() -> None:
    """Code that wakes at its deadline and sleeps ``due - now`` again must not spin."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        due = 60.98325816268421
        rounds = 0
        while loop.time() < due:
            rounds += 1
            assert rounds < 10
            await asyncio.sleep(due - loop.time())
        return rounds

    assert run_virtual(main) <= 3


def test_deadlock_is_reported() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(Deadlock):
        run_virtual(main)


def test_wall_limit_stops_a_busy_loop() -> None:
    async def main() -> None:
        while True:
            await asyncio.sleep(0)

    with pytest.raises(WallTimeExceeded):
        run_virtual(main, wall_limit=0.2)


def test_loop_starts_at_the_given_time() -> None:
    loop = VirtualTimeLoop(start=100.0)
    try:
        assert loop.time() == 100.0
    finally:
        loop.close()


def test_a_thread_result_arrives_while_virtual_time_runs() -> None:
    """``call_soon_threadsafe`` still reaches the loop, which polls the self-pipe only now
    and then: the callback is queued before the byte is written."""

    pool = concurrent.futures.ThreadPoolExecutor(1)  # not the loop's: its shutdown waits

    async def main() -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        task = asyncio.create_task(ticker())
        result = await loop.run_in_executor(pool, lambda: time.sleep(0.05) or "done")
        task.cancel()
        return result, ticks

    with pool:
        result, ticks = run_virtual(main, wall_limit=30)
    assert result == "done" and ticks > 0


def test_real_io_is_seen_before_the_clock_moves() -> None:
    """With a file of its own registered, the loop polls it before every jump of the clock."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        got = loop.create_future()
        loop.add_reader(a, lambda: got.done() or got.set_result(loop.time()))
        try:
            b.send(b"x")
            sleeper = asyncio.create_task(asyncio.sleep(10.0))
            at = await got
            sleeper.cancel()
            return at
        finally:
            loop.remove_reader(a)
            a.close()
            b.close()

    assert run_virtual(main) < 1.0


def test_timers_fire_in_asyncio_heap_order_ties_included() -> None:
    """The loop keeps ``(when, timer)`` pairs in its heap: it must fire timers in the order a
    heap of the timers themselves (asyncio's) gives, equal deadlines included."""
    rng = random.Random(7)
    whens = [float(rng.randrange(12)) for _ in range(400)]
    fired: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for i, when in enumerate(whens):
            loop.call_at(when, fired.append, i)
        await asyncio.sleep(20.0)

    run_virtual(main, start=0.0)
    loop = asyncio.new_event_loop()
    try:
        heap: list[asyncio.TimerHandle] = []
        for i, when in enumerate(whens):
            heapq.heappush(heap, asyncio.TimerHandle(when, fired.append, (i,), loop))
        heapq.heappush(heap, asyncio.TimerHandle(20.0, fired.append, (-1,), loop))  # the sleep
        expected = [heapq.heappop(heap)._args[0] for _ in range(len(whens))]  # type: ignore[attr-defined]
    finally:
        loop.close()
    assert fired == expected
    assert expected != sorted(expected, key=lambda i: (whens[i], i))  # ties not in FIFO order
