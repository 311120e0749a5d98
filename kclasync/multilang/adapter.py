"""kclasync's processor contract, spoken to a MultiLang child: one ``MultiLangProcessor`` per
held shard, one child process each.

Owns: the conversation for each call (send one message; answer the child's checkpoint requests
with kclasync's fenced checkpoints and the daemon's error strings; return on the child's status
for that message), the order the daemon gives (``shutdownRequested`` then ``leaseLost`` on a
stop or a handoff; the child's stdin closed after ``leaseLost`` and ``shardEnded``), and what a
failing child means, as the daemon decides it:

* the child exits, closes its output or answers a status for another action during
  ``initialize``, ``processRecords``, ``leaseLost`` or ``shardEnded``: the daemon logs it and
  exits with status 1 (``System.exit`` runs its shutdown hook: a graceful stop of the other
  shards). Here: the same, through ``on_failure`` (the worker stops gracefully, exit status 1);
  this shard takes no more checkpoints, so its next owner resumes at its last one.
* the same during ``shutdownRequested``: logged, and the shutdown goes on.
* no answer within ``timeoutInSeconds``: the daemon halts at once; here ``on_failure`` with
  ``abrupt=True`` (no graceful stop, exit status 1).
* a line that is not a message: skipped and logged (``kclasync.multilang.child``).

A conversation runs to its end even if the call is cancelled (a lease lost mid-batch): the next
message (``leaseLost``) is only written after the child answered the one before, as the daemon
does. A slow child holds only its own shard: each shard's pipeline awaits only its own child.
Must not: encode messages (``protocol``) or manage the process (``child``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from kclasync._core.leases.position import Checkpoint
from kclasync._processor import Checkpointer, ShardInfo
from kclasync._records import Record
from kclasync.errors import (
    AdapterError,
    CheckpointError,
    InvalidCheckpointError,
    LeaseLostError,
    ThrottledError,
)
from kclasync.multilang import protocol as p
from kclasync.multilang.child import Child, ChildFailedError, ChildTimeoutError

log = logging.getLogger("kclasync.multilang")

#: ``on_failure(shard_id, error, abrupt)``: a child failed the way that stops the daemon.
FailureHandler = Callable[[str, ChildFailedError, bool], None]


def checkpoint_error(exc: Exception) -> str:
    """The daemon's error string for a checkpoint kclasync refused."""
    if isinstance(exc, LeaseLostError):
        return p.ERROR_LEASE_LOST
    if isinstance(exc, InvalidCheckpointError | ValueError):
        return p.ERROR_INVALID
    if isinstance(exc, ThrottledError):
        return p.ERROR_THROTTLED
    if isinstance(exc, AdapterError):
        return p.ERROR_DEPENDENCY
    return p.ERROR_NO_CHECKPOINTER


class MultiLangProcessor:
    """A record processor whose work is done by a child process speaking the MultiLang protocol."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        on_failure: FailureHandler,
        children: set[Child],
        timeout: float | None = None,
        close_grace: float = 30.0,
    ) -> None:
        self._command = tuple(command)
        self._on_failure = on_failure
        self._children = children
        self._timeout = timeout
        self._close_grace = close_grace
        self._child: Child | None = None
        self._shard_id = "?"
        self._failed = False
        self._lock = asyncio.Lock()

    # -- the processor contract ------------------------------------------------------------

    async def initialize(self, shard: ShardInfo) -> None:
        self._shard_id = shard.shard_id
        try:
            self._child = await Child.start(self._command, shard.shard_id)
        except ChildFailedError as exc:
            self._fail(exc, abrupt=False)
            return
        self._children.add(self._child)
        start = shard.starting_checkpoint
        try:
            await self._converse(
                p.INITIALIZE,
                p.encode_initialize(shard.shard_id, start.value, start.sub_sequence),
                None,
            )
        except asyncio.CancelledError:
            # Cancelled before the shard started (its lease lost): no other call will come, so
            # the child is not left running.
            self._child.kill()
            self._children.discard(self._child)
            raise

    async def process_records(
        self,
        records: Sequence[Record],
        checkpointer: Checkpointer,
        millis_behind_latest: int | None,
    ) -> None:
        await self._converse(
            p.PROCESS_RECORDS,
            p.encode_process_records(records, millis_behind_latest),
            checkpointer,
        )

    async def lease_lost(self) -> None:
        await self._converse(p.LEASE_LOST, p.encode_lease_lost(), None)
        await self._close()

    async def shard_ended(self, checkpointer: Checkpointer) -> None:
        await self._converse(p.SHARD_ENDED, p.encode_shard_ended(), checkpointer, shard_end=True)
        await self._close()

    async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        # The daemon: shutdownRequested (a failure is only logged), then, as the lease goes,
        # leaseLost, after which the child's stdin is closed.
        await self._converse(
            p.SHUTDOWN_REQUESTED, p.encode_shutdown_requested(), checkpointer, fatal=False
        )
        await self._converse(p.LEASE_LOST, p.encode_lease_lost(), None)
        await self._close()

    # -- the conversation ------------------------------------------------------------------

    async def _converse(
        self,
        action: str,
        line: bytes,
        checkpointer: Checkpointer | None,
        *,
        shard_end: bool = False,
        fatal: bool = True,
    ) -> None:
        if self._failed or self._child is None:
            return
        # Shielded: a cancelled call leaves the exchange to finish (the child is mid-answer).
        exchange = asyncio.ensure_future(
            self._exchange(self._child, action, line, checkpointer, shard_end, fatal)
        )
        await asyncio.shield(exchange)

    async def _exchange(
        self,
        child: Child,
        action: str,
        line: bytes,
        checkpointer: Checkpointer | None,
        shard_end: bool,
        fatal: bool,
    ) -> None:
        async with self._lock:
            if self._failed:
                return
            try:
                await child.send(line)
                while True:
                    message = await child.next_message(self._timeout)
                    if isinstance(message, p.CheckpointRequest):
                        await child.send(await self._checkpoint(message, checkpointer, shard_end))
                    elif isinstance(message, p.Status):
                        if message.response_for != action:
                            raise ChildFailedError(
                                f"the child of shard {self._shard_id} answered "
                                f"{message.response_for!r} while {action!r} was awaited"
                            )
                        return
                    # Another of the daemon's messages: ignored while waiting for the status.
            except ChildFailedError as exc:
                if fatal:
                    self._fail(exc, abrupt=isinstance(exc, ChildTimeoutError))
                else:
                    log.error("the child of shard %s failed %s: %s", self._shard_id, action, exc)

    async def _checkpoint(
        self, request: p.CheckpointRequest, checkpointer: Checkpointer | None, shard_end: bool
    ) -> bytes:
        seq, sub = request.sequence_number, request.sub_sequence
        error: str | None = None
        if checkpointer is None:
            error = p.ERROR_NO_CHECKPOINTER
        elif not request.valid:
            error = p.ERROR_INVALID
        else:
            try:
                await self._write(checkpointer, seq, sub or 0, shard_end)
            except (CheckpointError, AdapterError, ValueError) as exc:
                log.info("checkpoint of shard %s at %s refused: %s", self._shard_id, seq, exc)
                error = checkpoint_error(exc)
        return p.encode_checkpoint_reply(seq, sub, error)

    @staticmethod
    async def _write(
        checkpointer: Checkpointer, seq: str | None, sub: int, shard_end: bool
    ) -> None:
        last = checkpointer.last_delivered
        if shard_end and (seq is None or Checkpoint(seq, sub) == last):
            # The daemon: at shard end the largest permitted checkpoint is SHARD_END, and the
            # last record's sequence number is written as SHARD_END.
            await checkpointer.checkpoint_shard_end()
        elif seq is None and last is None:
            return  # nothing delivered yet: the daemon writes nothing and reports no error
        else:
            await checkpointer.checkpoint(seq, sub)

    # -- failure and closing ---------------------------------------------------------------

    def _fail(self, exc: ChildFailedError, *, abrupt: bool) -> None:
        self._failed = True
        log.error("record processor of shard %s failed: %s", self._shard_id, exc)
        if self._child is not None:
            self._child.kill()
        self._on_failure(self._shard_id, exc, abrupt)

    async def _close(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        try:
            await child.close(self._close_grace)
        finally:
            self._children.discard(child)
