"""The checkpointer a shard's processor gets: fenced writes, and buffered checkpoints.

``checkpoint(..., persist=False)`` only records the position in memory; ``flush_every`` (a task
of the shard's pipeline) writes the newest recorded one every ``checkpoint_interval`` seconds
(at most that long after it was recorded),
and the pipeline flushes before SHARD_END and after ``shutdown_requested`` returns (a stop, a
release or a handoff). Writes are serialised and never move the checkpoint backwards, so a flush
racing a ``persist=True`` checkpoint cannot undo it. A crash loses at most the positions recorded
since the last write: those records are processed again (at-least-once, as always).

Owns: validating positions (``_core.leases.checkpoint_rules``), the buffer, and the order of
writes. Must not: decide lease ownership (``HeldLeases`` fences every write).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kclasync._core.leases.checkpoint_rules import validate_checkpoint
from kclasync._core.leases.held_lease import HeldLease
from kclasync._core.leases.position import SHARD_END, Checkpoint
from kclasync._runtime.held import HeldLeases
from kclasync.errors import AdapterError, InvalidCheckpointError, LeaseLostError

log = logging.getLogger("kclasync.shard")


def _not_after(target: Checkpoint, current: Checkpoint) -> bool:
    """True when writing ``target`` would not move a sequence checkpoint forward."""
    return target.is_sequence and current.is_sequence and target.key() <= current.key()


class ShardCheckpointer:
    """The ``Checkpointer`` handed to a shard's processor."""

    def __init__(self, leases: HeldLeases, held: HeldLease, on_write: Callable[[], None]):
        self._leases = leases
        self._key = held.key
        self._shard_id = held.lease.shard_id
        self._last_checkpoint = held.lease.checkpoint
        self._on_write = on_write
        self._write_lock = asyncio.Lock()
        #: The newest position recorded with ``persist=False`` and not written yet.
        self.buffered: Checkpoint | None = None
        #: Set when a position is buffered: ``flush_every`` waits for it while none is.
        self._buffering = asyncio.Event()
        #: Checkpoint writes done and ``persist=False`` calls that did not write (for metrics
        #: and benchmarks).
        self.writes = 0
        self.buffered_calls = 0
        self.last_delivered_position: Checkpoint | None = None
        self.shard_end_reached = False

    @property
    def shard_id(self) -> str:
        return self._shard_id

    @property
    def last_checkpoint(self) -> Checkpoint:
        """The last checkpoint written to the lease table (a restart resumes here)."""
        return self._last_checkpoint

    @property
    def last_delivered(self) -> Checkpoint | None:
        return self.last_delivered_position

    def _target(self, sequence_number: str | None, sub_sequence_number: int) -> Checkpoint:
        if sequence_number is None:
            if self.last_delivered_position is None:
                raise InvalidCheckpointError(
                    f"cannot checkpoint shard {self._shard_id}: no record has been delivered yet"
                )
            return self.last_delivered_position
        try:
            return Checkpoint(str(sequence_number), sub_sequence_number)
        except ValueError as exc:
            raise InvalidCheckpointError(
                f"cannot checkpoint shard {self._shard_id}: {exc}"
            ) from None

    async def _write(self, target: Checkpoint) -> None:
        async with self._write_lock:
            if target == self._last_checkpoint or _not_after(target, self._last_checkpoint):
                return
            written = await self._leases.checkpoint(self._key, target)
            self._last_checkpoint = written.checkpoint
            self.writes += 1
            self._on_write()
        current = self._last_checkpoint
        if self.buffered is not None and (
            self.buffered == current or _not_after(self.buffered, current)
        ):
            self.buffered = None

    async def checkpoint(
        self,
        sequence_number: str | None = None,
        sub_sequence_number: int = 0,
        *,
        persist: bool = True,
    ) -> None:
        target = validate_checkpoint(
            self._target(sequence_number, sub_sequence_number),
            current=self._last_checkpoint,
            last_delivered=self.last_delivered_position,
            shard_end_reached=self.shard_end_reached,
        )
        if target == self._last_checkpoint:
            return
        if not persist:
            if self.buffered is None or not _not_after(target, self.buffered):
                self.buffered = target
                self._buffering.set()
            self.buffered_calls += 1
            return
        await self._write(target)

    async def flush(self) -> None:
        """Write the buffered position now, if any (errors propagate)."""
        target = self.buffered
        if target is not None:
            await self._write(target)

    async def flush_every(self, interval: float) -> None:
        """Write the buffered position every ``interval`` seconds until cancelled or the lease
        is lost; a failed write is retried at the next tick (the position stays buffered).
        While nothing is buffered it waits for a position instead (no wake-up per interval
        for a processor that never buffers), and writes it ``interval`` seconds later."""
        while True:
            if self.buffered is None:
                self._buffering.clear()
                await self._buffering.wait()
            await asyncio.sleep(interval)
            try:
                await self.flush()
            except LeaseLostError:
                return
            except AdapterError as exc:
                log.info("buffered checkpoint of shard %s not written: %s", self._shard_id, exc)

    async def checkpoint_shard_end(self) -> None:
        validate_checkpoint(
            SHARD_END,
            current=self._last_checkpoint,
            last_delivered=self.last_delivered_position,
            shard_end_reached=self.shard_end_reached,
        )
        async with self._write_lock:
            written = await self._leases.checkpoint(self._key, SHARD_END)
            self._last_checkpoint = written.checkpoint
            self.writes += 1
            self._on_write()
        self.buffered = None

    async def prepare_checkpoint(
        self, sequence_number: str | None = None, sub_sequence_number: int = 0
    ) -> None:
        target = validate_checkpoint(
            self._target(sequence_number, sub_sequence_number),
            current=self._last_checkpoint,
            last_delivered=self.last_delivered_position,
            shard_end_reached=self.shard_end_reached,
        )
        await self._leases.checkpoint(self._key, self._last_checkpoint, pending=target)
