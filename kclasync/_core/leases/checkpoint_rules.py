"""Which checkpoints a processor may write.

Owns: the rule that a checkpoint never moves backwards and never passes the last record delivered
to the processor; SHARD_END only once the shard's end was delivered.
Must not: do I/O.
"""

from __future__ import annotations

from kclasync._core.leases.position import Checkpoint
from kclasync.errors import InvalidCheckpointError


def validate_checkpoint(
    requested: Checkpoint,
    *,
    current: Checkpoint,
    last_delivered: Checkpoint | None,
    shard_end_reached: bool,
) -> Checkpoint:
    """Return ``requested`` if it is a legal next checkpoint, else raise InvalidCheckpointError."""
    if requested.is_shard_end:
        if not shard_end_reached:
            raise InvalidCheckpointError(
                "SHARD_END can only be checkpointed after the end of the shard was delivered"
            )
        return requested
    if not requested.is_sequence:
        raise InvalidCheckpointError(
            f"{requested.value} cannot be checkpointed; use a sequence number"
        )
    if current.is_shard_end:
        raise InvalidCheckpointError("the shard is already checkpointed at SHARD_END")
    if last_delivered is None or not last_delivered.is_sequence:
        raise InvalidCheckpointError(
            f"cannot checkpoint {requested}: no record has been delivered yet"
        )
    if requested.key() > last_delivered.key():
        raise InvalidCheckpointError(
            f"cannot checkpoint {requested}: beyond the last delivered record {last_delivered}"
        )
    if current.is_sequence and requested.key() < current.key():
        raise InvalidCheckpointError(
            f"cannot checkpoint {requested}: before the current checkpoint {current}"
        )
    return requested
