"""Fault injection for the in-memory adapters: latency, throttling and transient errors.

Owns: ``OpFaults`` (the faults of one operation), ``FaultPlan`` (faults by operation name, drawn
from an injected ``random.Random``) and ``with_faults``, which every in-memory adapter call goes
through, including transient errors raised after a write was applied (an unknown outcome).
Must not: read any clock but the running loop's, draw unseeded randomness, or know any adapter.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import attrs

from kclasync.errors import ThrottledError, TransientError

_T = TypeVar("_T")

#: Seconds to wait, or a function of the plan's random generator returning them.
Latency = float | Callable[[random.Random], float]


def _probability(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be a probability in [0, 1], not {value}")


@attrs.frozen
class OpFaults:
    """Faults for one operation.

    ``latency`` is awaited (``asyncio.sleep``) before the call takes effect; None means the call
    completes without yielding to the event loop. ``throttle`` and ``transient`` are per-call
    probabilities of ThrottledError and TransientError. ``transient_after_write`` is the share of
    those transient errors raised *after* the call was applied (an unknown outcome, as with a
    timeout): the write happened but the caller does not hear back.
    """

    latency: Latency | None = None
    throttle: float = attrs.field(default=0.0, validator=_probability)
    transient: float = attrs.field(default=0.0, validator=_probability)
    transient_after_write: float = attrs.field(default=0.0, validator=_probability)


NO_FAULTS = OpFaults()


@attrs.define
class FaultPlan:
    """Faults by operation name (the adapter method's name, e.g. ``renew_lease``, ``get_records``).

    Every call draws three numbers from ``rng`` when it starts (plus whatever a latency function
    draws), whatever the outcome, so a run is reproducible from the seed and the call order.
    ``operations`` may be changed while a simulation runs (e.g. to start or end an outage).
    """

    rng: random.Random
    default: OpFaults = NO_FAULTS
    operations: dict[str, OpFaults] = attrs.field(factory=dict)
    #: Faults injected, keyed ``"<operation>:<kind>"`` with kind throttled, transient_before
    #: or transient_after.
    injected: Counter[str] = attrs.field(factory=Counter)

    def for_operation(self, operation: str) -> OpFaults:
        return self.operations.get(operation, self.default)

    def draw(self, operation: str) -> tuple[OpFaults, float | None, float, float, float]:
        """The call's faults, latency (None: none) and three draws, taken when it starts."""
        faults = self.for_operation(operation)
        latency = faults.latency
        delay: float | None
        if latency is None:
            delay = None
        elif callable(latency):
            delay = max(0.0, float(latency(self.rng)))
        else:
            delay = max(0.0, float(latency))
        rng = self.rng.random
        return faults, delay, rng(), rng(), rng()

    def outcome(
        self,
        operation: str,
        faults: OpFaults,
        throttle_draw: float,
        transient_draw: float,
        after: float,
    ) -> bool:
        """Raise the faults that happen before the call takes effect (after its latency).

        Returns True when the call must take effect and then raise TransientError.
        """
        if throttle_draw < faults.throttle:
            self.injected[f"{operation}:throttled"] += 1
            raise ThrottledError(f"injected throttling of {operation}")
        if transient_draw < faults.transient:
            if after < faults.transient_after_write:
                self.injected[f"{operation}:transient_after"] += 1
                return True
            self.injected[f"{operation}:transient_before"] += 1
            raise TransientError(f"injected transient failure of {operation} (not applied)")
        return False


async def with_faults(plan: FaultPlan | None, operation: str, apply: Callable[[], _T]) -> _T:
    if plan is None:
        return apply()
    faults, delay, throttle_draw, transient_draw, after_draw = plan.draw(operation)
    if delay is not None:
        await asyncio.sleep(delay)
    # ``outcome`` raises or reports only when a draw falls under its probability.
    fail_after = (
        throttle_draw < faults.throttle or transient_draw < faults.transient
    ) and plan.outcome(operation, faults, throttle_draw, transient_draw, after_draw)
    result = apply()
    if fail_after:
        raise TransientError(f"injected transient failure of {operation} (outcome unknown)")
    return result
