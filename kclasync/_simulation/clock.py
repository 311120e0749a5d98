"""A virtual-time asyncio event loop for deterministic simulation.

``VirtualTimeLoop`` is asyncio's own selector event loop with two changes: ``time()`` returns a
virtual clock, and when nothing is ready to run the loop does not wait for the next timer, it
moves the clock to it. (For speed it also runs its own copy of asyncio's loop turn, and keeps
``(when, timer)`` pairs in the timer heap; neither changes what runs when.) Real I/O still
works (the loop keeps its self-pipe for ``call_soon_threadsafe``), but a simulation should do
none: time only moves when every task is waiting for a timer, so a whole fleet's hours pass in
the seconds the CPU needs for its events.

The runtime reads time only from ``loop.time()`` and sleeps only with ``asyncio.sleep`` /
``wait_for`` timeouts, so it runs here unchanged. Ready callbacks run in FIFO order and timers
fire in deadline order (ties in the order asyncio's timer heap gives, which depends only on
the order they were scheduled in), so a run is reproducible given the same
program and the same random seeds.

The PyPI package ``looptime`` fast-forwards loop time too, but as a pytest plugin that patches a
running loop; the ``kclasync simulate`` command needs a standalone loop, and this one is small.

Owns: the loop class and ``run_virtual`` (its clock and selector: ``virtual_selector``).
Must not: read the wall clock (the selector's ``wall_limit`` guard aside).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import heapq
from asyncio import format_helpers
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kclasync._simulation.virtual_selector import (
    Deadlock,
    VirtualClock,
    WallTimeExceeded,
    _VirtualSelector,
)

_T = TypeVar("_T")

# asyncio's own constants for its loop turn (``asyncio.base_events``), which ``_run_once``
# follows: purge cancelled timers when over half of more than 100 are cancelled; cap a wait.
_MIN_SCHEDULED = 100
_MIN_CANCELLED_SHARE = 0.5
_MAX_SELECT_TIMEOUT = 24 * 3600

_new_handle: Any = object.__new__


class _Timer(asyncio.TimerHandle):
    """An ``asyncio.TimerHandle`` whose ``cancel`` is asyncio's, written in: every
    ``asyncio.sleep`` cancels its timer when it ends, most often one that has fired."""

    __slots__ = ()

    def cancel(self) -> None:
        h: Any = self  # its private fields, as asyncio.events sets them
        if not h._cancelled:
            loop = h._loop
            if h._scheduled:  # the loop's _timer_handle_cancelled
                loop._timer_cancelled_count += 1
            h._cancelled = True
            if loop._debug:
                h._repr = repr(self)
            h._callback = None
            h._args = None


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` is virtual and jumps to the next timer when idle."""

    def __init__(self, start: float = 0.0, *, wall_limit: float | None = None) -> None:
        self.clock = VirtualClock(start)
        self._virtual = _VirtualSelector(self.clock, wall_limit, self._next_timer, self._busy)
        super().__init__(selector=self._virtual)
        self._virtual.own_files = len(self._virtual.get_map())
        # A real loop runs timers up to one clock tick early, which is harmless because real
        # time moves while code runs. Here it does not: code that fires a tick early, sees it
        # is still (one float step) before its deadline and sleeps the rest would spin without
        # time ever moving. So timers fire only once the virtual clock has reached them.
        self._clock_resolution = 0.0
        # asyncio's create_future (``Future(loop=self)``, one per ``asyncio.sleep``) as a
        # partial, called without a Python frame.
        self.create_future = functools.partial(asyncio.Future, loop=self)  # type: ignore[method-assign]

    def call_soon(  # type: ignore[override]
        self,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        """asyncio's ``call_soon``, its ``_call_soon`` step and the handle's ``__init__``
        written in (outside debug mode): every task wake-up comes through here."""
        loop: Any = self  # asyncio's private loop state, as base_events keeps it
        if loop._closed:
            raise RuntimeError("Event loop is closed")
        if loop._debug:
            loop._check_thread()
            loop._check_callback(callback, "call_soon")
            handle = asyncio.Handle(callback, args, self, context)
            state: Any = handle  # its private fields, as base_events reads them
            if state._source_traceback:
                del state._source_traceback[-1]
            loop._ready.append(handle)
            return handle
        h: Any = _new_handle(asyncio.Handle)
        h._context = contextvars.copy_context() if context is None else context
        h._loop = self
        h._callback = callback
        h._args = args
        h._cancelled = False
        h._repr = None
        h._source_traceback = None
        loop._ready.append(h)
        return h  # type: ignore[no-any-return]

    def call_later(  # type: ignore[override]
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """asyncio's ``call_later`` (``call_at(time() + delay)``), with the clock read
        directly: every ``asyncio.sleep`` comes through here."""
        if delay is None:
            raise TypeError("delay must not be None")
        loop: Any = self  # asyncio's private loop state, as base_events keeps it
        if loop._debug or loop._closed:
            return self._schedule(self.clock.now + delay, callback, args, context)
        # _schedule's steps outside debug mode, written in
        when = self.clock.now + delay
        timer: Any = _new_handle(_Timer)
        timer._context = contextvars.copy_context() if context is None else context
        timer._loop = self
        timer._callback = callback
        timer._args = args
        timer._cancelled = False
        timer._repr = None
        timer._source_traceback = None
        timer._when = when
        heapq.heappush(loop._scheduled, (when, timer))
        timer._scheduled = True
        return timer  # type: ignore[no-any-return]

    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """asyncio's ``call_at``, except that the timer heap holds ``(when, timer)`` pairs.

        Comparing two pairs gives what comparing the two timers gives (``TimerHandle``
        orders by ``when`` alone, and on equal ``when`` neither is less), so the heap keeps the
        same order, ties included; but the comparison of two floats runs in C instead of a
        Python ``__lt__``, ~5 % of a large simulation.
        """
        if when is None:
            raise TypeError("when cannot be None")
        return self._schedule(when, callback, args, context)

    def _schedule(
        self,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: contextvars.Context | None,
    ) -> asyncio.TimerHandle:
        """The timer of ``call_at`` and ``call_later``, pushed onto the heap: a ``_Timer``
        (an ``asyncio.TimerHandle`` whose cancel is written in), built without its
        ``__init__`` outside debug mode."""
        loop: Any = self  # asyncio's private loop state, as base_events keeps it
        if loop._closed:
            raise RuntimeError("Event loop is closed")
        if loop._debug:
            loop._check_thread()
            loop._check_callback(callback, "call_at")
            timer: Any = _Timer(when, callback, args, self, context)
            if timer._source_traceback:
                del timer._source_traceback[-2:]  # this method and call_at or call_later
        else:
            timer = _new_handle(_Timer)
            timer._context = contextvars.copy_context() if context is None else context
            timer._loop = self
            timer._callback = callback
            timer._args = args
            timer._cancelled = False
            timer._repr = None
            timer._source_traceback = None
            timer._when = when
        heapq.heappush(loop._scheduled, (when, timer))
        timer._scheduled = True
        return timer  # type: ignore[no-any-return]

    def _run_once(self) -> None:
        """asyncio's ``BaseEventLoop._run_once``, turn after turn, step for step (cancelled
        timers dropped, I/O polled or the clock moved, due timers made ready, the ready
        callbacks run in order), over the ``(when, timer)`` heap of ``call_at`` and with the
        virtual selector's decision called directly: a turn per timer and per wake-up is
        most of a large simulation's loop overhead. Debug mode's slow-callback warning is
        left out: no virtual time passes while a callback runs.

        The turns follow one another here, without going back through ``run_forever``
        (whose loop does nothing between two turns but test ``_stopping``), until
        ``stop()`` was called: then back there after that turn, as ``run_forever`` stops
        after any turn. Cancelled timers are looked for only while some may be in the heap
        (``_timer_cancelled_count`` counts at least those)."""
        loop: Any = self  # asyncio's private loop state, as base_events keeps it
        ready: collections.deque[Any] = loop._ready
        clock = self.clock
        virtual = self._virtual
        popleft = ready.popleft
        heappop = heapq.heappop
        while True:
            if loop._timer_cancelled_count:
                self._drop_cancelled_timers()
            scheduled = loop._scheduled
            if ready or loop._stopping:
                events = virtual.poll_busy()
            elif scheduled:
                when = scheduled[0][0]
                timeout = min(max(0, when - clock.now), _MAX_SELECT_TIMEOUT)
                events = virtual.poll_or_advance(False, timeout, when)
            else:
                events = virtual.poll_or_advance(False, None, None)
            if events:
                loop._process_events(events)
            end_time = clock.now  # the clock resolution is 0
            while scheduled:
                if scheduled[0][0] >= end_time:
                    break
                handle = heappop(scheduled)[1]
                handle._scheduled = False
                ready.append(handle)
            if loop._debug:
                for _ in range(len(ready)):
                    handle = popleft()
                    if handle._cancelled:
                        continue
                    try:
                        loop._current_handle = handle
                        handle._run()
                    finally:
                        loop._current_handle = None
            else:
                for _ in range(len(ready)):
                    handle = popleft()
                    if handle._cancelled:
                        continue
                    try:  # the handle's _run, written in
                        handle._context.run(handle._callback, *handle._args)
                    except (SystemExit, KeyboardInterrupt):
                        raise
                    except BaseException as exc:
                        self._callback_failed(handle, exc)
            if loop._stopping:
                return

    def _callback_failed(self, handle: Any, exc: BaseException) -> None:
        """What ``asyncio.Handle._run`` does when its callback raises."""
        callback = format_helpers._format_callback_source(handle._callback, handle._args)
        context: dict[str, Any] = {
            "message": f"Exception in callback {callback}",
            "exception": exc,
            "handle": handle,
        }
        if handle._source_traceback:
            context["source_traceback"] = handle._source_traceback
        self.call_exception_handler(context)

    def _drop_cancelled_timers(self) -> list[tuple[float, Any]]:
        """The first step of a turn, as asyncio's: drop cancelled timers from the heap (all
        of them when over half of more than 100 are cancelled, else those at its top);
        returns the heap."""
        loop: Any = self  # asyncio's private loop state, as base_events keeps it
        scheduled: list[tuple[float, Any]] = loop._scheduled
        count = len(scheduled)
        if count > _MIN_SCHEDULED and loop._timer_cancelled_count / count > _MIN_CANCELLED_SHARE:
            kept = []
            for entry in scheduled:
                if entry[1]._cancelled:
                    entry[1]._scheduled = False
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            loop._scheduled = scheduled = kept
            loop._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][1]._cancelled:
                loop._timer_cancelled_count -= 1
                heapq.heappop(scheduled)[1]._scheduled = False
        return scheduled

    def _busy(self) -> bool:
        return bool(getattr(self, "_ready", ())) or bool(getattr(self, "_stopping", False))

    def _next_timer(self) -> float | None:
        scheduled: list[tuple[float, asyncio.TimerHandle]] = getattr(self, "_scheduled", [])
        return scheduled[0][0] if scheduled else None

    def time(self) -> float:
        return self.clock.now


def run_virtual(
    main: Callable[[], Awaitable[_T]], *, start: float = 0.0, wall_limit: float | None = None
) -> _T:
    """Run ``main()`` to completion on a fresh ``VirtualTimeLoop`` and close it.

    ``wall_limit``: raise ``WallTimeExceeded`` once this many real seconds have passed (the only
    wall-clock read; a guard against runaway runs, checked every 4096 loop iterations).
    """

    async def wrapper() -> _T:
        return await main()

    def factory() -> VirtualTimeLoop:
        return VirtualTimeLoop(start, wall_limit=wall_limit)

    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(wrapper())


__all__ = ["Deadlock", "VirtualClock", "VirtualTimeLoop", "WallTimeExceeded", "run_virtual"]
