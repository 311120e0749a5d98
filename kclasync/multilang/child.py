"""One record-processor child process: started from the command, written to on stdin, read
from on stdout, its stderr logged line by line with the shard id.

Owns: the asyncio subprocess and its three pipes, the next message from stdout (skipping the
lines the daemon skips, logging each as the daemon does), the optional answer timeout, and
closing (stdin closed, stdout and stderr drained, the exit awaited; killed if it will not go).
Must not: decide what to send or what an answer means (``kclasync.multilang.adapter``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from kclasync.errors import KclAsyncError
from kclasync.multilang.protocol import ChildMessage, NotAMessage, decode_child_line

log = logging.getLogger("kclasync.multilang")

#: The longest line read from the child (a status or checkpoint line is ~100 bytes; stderr
#: lines longer than this are cut).
_LINE_LIMIT = 16 * 1024 * 1024


class ChildFailedError(KclAsyncError):
    """The child exited, closed a pipe, did not answer in time, or answered the wrong action."""


class ChildTimeoutError(ChildFailedError):
    """The child did not answer within ``timeoutInSeconds``."""


class Child:
    """A running child process for one shard."""

    def __init__(self, proc: asyncio.subprocess.Process, shard_id: str) -> None:
        self.proc = proc
        self.shard_id = shard_id
        self._stderr = asyncio.create_task(self._pump_stderr(), name=f"stderr {shard_id}")

    @classmethod
    async def start(cls, command: Sequence[str], shard_id: str) -> Child:
        """Start ``command`` (inheriting the environment and working directory, as the
        daemon's ``ProcessBuilder`` does)."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=_LINE_LIMIT,
                # Its own process group: a Ctrl-C or a SIGTERM to this worker's group
                # reaches only this worker, which then asks each child to shut down.
                process_group=0,
            )
        except OSError as exc:
            raise ChildFailedError(
                f"cannot start the record processor {' '.join(command)!r} for shard "
                f"{shard_id}: {exc}"
            ) from exc
        log.info("started %s for shard %s (pid %d)", command[0], shard_id, proc.pid)
        return cls(proc, shard_id)

    async def _pump_stderr(self) -> None:
        stream = self.proc.stderr
        assert stream is not None
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # a line over the limit: what was read is dropped
                continue
            except (ConnectionError, OSError):
                return
            if not line:
                return
            text = line.decode("utf-8", errors="replace").rstrip("\r\n")
            log.error("Received error line from subprocess [%s] for shard %s", text, self.shard_id)

    async def send(self, line: bytes) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        if stdin.is_closing():
            raise ChildFailedError(f"the child of shard {self.shard_id} closed its stdin")
        try:
            stdin.write(line)
            await stdin.drain()
        except (ConnectionError, OSError) as exc:
            raise ChildFailedError(
                f"cannot write to the child of shard {self.shard_id}: {exc}"
            ) from exc

    async def next_message(self, timeout: float | None) -> ChildMessage:
        """The next line that is a message; empty lines and lines that are not messages are
        skipped (the daemon logs the latter). Raises ``ChildFailedError`` at end of output,
        or when ``timeout`` seconds pass without a message."""
        if timeout is None:
            return await self._next_message()
        try:
            return await asyncio.wait_for(self._next_message(), timeout)
        except TimeoutError:
            raise ChildTimeoutError(
                f"the child of shard {self.shard_id} did not answer within {timeout:g}s "
                "(timeoutInSeconds)"
            ) from None

    async def _next_message(self) -> ChildMessage:
        stdout = self.proc.stdout
        assert stdout is not None
        while True:
            try:
                raw = await stdout.readline()
            except ValueError as exc:
                raise ChildFailedError(
                    f"the child of shard {self.shard_id} wrote a line over {_LINE_LIMIT} bytes"
                ) from exc
            if not raw:
                code = self.proc.returncode
                raise ChildFailedError(
                    f"reached the end of the child's stdout for shard {self.shard_id}"
                    + ("" if code is None else f" (exit status {code})")
                )
            message = decode_child_line(raw)
            if message is None:
                continue
            if isinstance(message, NotAMessage):
                log.info(
                    "Skipping unexpected line on STDOUT for shard %s: %s",
                    self.shard_id,
                    message.line,
                )
                continue
            return message

    async def close(self, grace: float) -> int | None:
        """Close stdin (the child's signal to exit), drain its output, wait up to ``grace``
        seconds for it to exit, then kill it. Returns the exit status."""
        stdin = self.proc.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
            with contextlib.suppress(ConnectionError, OSError):
                await stdin.wait_closed()
        try:
            await asyncio.wait_for(self._drain_and_wait(), grace)
        except TimeoutError:
            log.warning(
                "the child of shard %s did not exit within %gs: killed", self.shard_id, grace
            )
            self.kill()
            await self.proc.wait()
        await asyncio.gather(self._stderr, return_exceptions=True)
        log.info("child of shard %s exited with status %s", self.shard_id, self.proc.returncode)
        return self.proc.returncode

    async def _drain_and_wait(self) -> None:
        stdout = self.proc.stdout
        if stdout is not None:
            with contextlib.suppress(ValueError, ConnectionError, OSError):
                while await stdout.read(65536):
                    pass
        await self.proc.wait()

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
