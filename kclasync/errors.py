"""The exceptions kclasync raises. Every one says what went wrong and on which lease or shard."""

from __future__ import annotations


class KclAsyncError(Exception):
    """Base class of every kclasync error."""


class ConfigError(KclAsyncError, ValueError):
    """A configuration value is invalid. ``field`` names it."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"invalid configuration: {field}: {problem}")


class CheckpointError(KclAsyncError):
    """A checkpoint could not be written."""


class InvalidCheckpointError(CheckpointError, ValueError):
    """The requested checkpoint is not allowed (backwards, beyond the last record, ...)."""


class LeaseLostError(CheckpointError):
    """This worker no longer owns the lease, so it may not checkpoint it (fencing)."""

    def __init__(self, lease_key: str, detail: str = "") -> None:
        self.lease_key = lease_key
        msg = f"lease {lease_key!r} is no longer held by this worker"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class ShutdownCheckpointError(CheckpointError):
    """A processor returned from ``shard_ended`` without checkpointing SHARD_END."""


class ProcessorFailedError(KclAsyncError):
    """A processor kept raising on a batch after every retry. The batch was not checkpointed."""

    def __init__(
        self, shard_id: str, first_sequence: str, last_sequence: str, attempts: int
    ) -> None:
        self.shard_id = shard_id
        self.first_sequence = first_sequence
        self.last_sequence = last_sequence
        self.attempts = attempts
        super().__init__(
            f"processor failed {attempts} times on shard {shard_id} records "
            f"{first_sequence}..{last_sequence}; the batch was not checkpointed"
        )


class AdapterError(KclAsyncError):
    """An I/O call (to the lease table or the stream) failed."""


class ThrottledError(AdapterError):
    """The service asked us to slow down (ProvisionedThroughputExceeded, LimitExceeded, ...)."""


class TransientError(AdapterError):
    """A failure worth retrying (timeouts, 5xx, connection errors)."""


class StreamNotFoundError(KclAsyncError):
    def __init__(self, stream: str) -> None:
        self.stream = stream
        super().__init__(f"stream {stream!r} does not exist")


def error_code(exc: BaseException) -> str:
    """The AWS error code of ``exc`` or of an exception it was raised from (botocore's
    ``ClientError`` carries it in ``response["Error"]["Code"]``); else the type name of the
    innermost cause, such as ``ServerDisconnectedError`` for a connection the server closed.
    For metrics and logs: the label of a retry."""
    seen: BaseException | None = exc
    last = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code:
                return str(code)
        last = seen
        seen = seen.__cause__ or seen.__context__
    return type(last).__name__
