"""Stream identities and the lease keys of multi-stream mode.

Owns: ``StreamIdentity`` (account, stream name, creation epoch) and the KCL's multi-stream lease
key ``<account>:<stream>:<creationEpoch>:<shardId>``, both ways.
Must not: do I/O.

Kinesis stream names are ``[a-zA-Z0-9_.-]+`` and account ids are digits, so ``:`` cannot occur
inside a part and a key splits unambiguously.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class StreamIdentity:
    """A stream as multi-stream lease keys name it. A stream deleted and created again under
    the same name has a new creation epoch, so its leases are new ones."""

    account_id: str
    name: str
    creation_epoch: int

    @property
    def key_prefix(self) -> str:
        return f"{self.account_id}:{self.name}:{self.creation_epoch}:"

    def lease_key(self, shard_id: str) -> str:
        return self.key_prefix + shard_id

    def owns(self, lease_key: str) -> bool:
        return lease_key.startswith(self.key_prefix)


def parse_multi_stream_key(lease_key: str) -> tuple[StreamIdentity, str] | None:
    """``(identity, shard id)`` for a multi-stream lease key, None for anything else."""
    parts = lease_key.split(":")
    if len(parts) != 4 or not all(parts):
        return None
    account, name, epoch, shard_id = parts
    if not epoch.isdigit():
        return None
    return StreamIdentity(account, name, int(epoch)), shard_id
