"""Stream positions and checkpoint values.

Owns: the value stored in a lease's ``checkpoint`` attribute (a sequence number or one of the
sentinels), its ordering, and the initial-position choices a consumer can start from.
Must not: do I/O, read clocks, or know about asyncio.
"""

from __future__ import annotations

import enum
from datetime import datetime

import attrs


class Sentinel(str, enum.Enum):
    """Checkpoint values that are not sequence numbers (the KCL's names, stored verbatim)."""

    TRIM_HORIZON = "TRIM_HORIZON"
    LATEST = "LATEST"
    AT_TIMESTAMP = "AT_TIMESTAMP"
    SHARD_END = "SHARD_END"


class InitialPositionKind(str, enum.Enum):
    LATEST = "LATEST"
    TRIM_HORIZON = "TRIM_HORIZON"
    AT_TIMESTAMP = "AT_TIMESTAMP"


@attrs.frozen
class InitialPosition:
    """Where a brand-new lease starts: ``LATEST``, ``TRIM_HORIZON`` or ``AT_TIMESTAMP``."""

    kind: InitialPositionKind
    timestamp: datetime | None = None

    def __attrs_post_init__(self) -> None:
        if self.kind is InitialPositionKind.AT_TIMESTAMP and self.timestamp is None:
            raise ValueError("initial_position AT_TIMESTAMP needs a timestamp")
        if self.kind is not InitialPositionKind.AT_TIMESTAMP and self.timestamp is not None:
            raise ValueError(f"initial_position {self.kind.value} takes no timestamp")
        if self.timestamp is not None and self.timestamp.tzinfo is None:
            raise ValueError("initial_position timestamp must be timezone-aware")

    @classmethod
    def latest(cls) -> InitialPosition:
        return cls(InitialPositionKind.LATEST)

    @classmethod
    def trim_horizon(cls) -> InitialPosition:
        return cls(InitialPositionKind.TRIM_HORIZON)

    @classmethod
    def at_timestamp(cls, when: datetime) -> InitialPosition:
        return cls(InitialPositionKind.AT_TIMESTAMP, when)

    @classmethod
    def parse(cls, text: str) -> InitialPosition:
        """Parse ``LATEST``, ``TRIM_HORIZON`` or ``AT_TIMESTAMP:<ISO-8601>``."""
        head, _, rest = text.partition(":")
        head = head.strip().upper()
        if head == "AT_TIMESTAMP":
            if not rest:
                raise ValueError("AT_TIMESTAMP needs a time: AT_TIMESTAMP:<ISO-8601>")
            return cls.at_timestamp(datetime.fromisoformat(rest.strip()))
        if rest:
            raise ValueError(f"unexpected text after {head!r}: {rest!r}")
        try:
            kind = InitialPositionKind(head)
        except ValueError:
            raise ValueError(
                f"unknown initial position {text!r}: use LATEST, TRIM_HORIZON or "
                "AT_TIMESTAMP:<ISO-8601>"
            ) from None
        return cls(kind)

    @property
    def sentinel(self) -> Sentinel:
        return Sentinel(self.kind.value)


def _is_sequence_number(text: str) -> bool:
    # ASCII only: str.isdigit() also accepts digits such as "²" that int() rejects.
    return text.isascii() and text.isdigit()


@attrs.frozen(order=False)
class Checkpoint:
    """A lease's checkpoint: a sentinel or a (sequence number, sub-sequence number) pair.

    Sequence numbers are decimal strings of up to 128 bits; they compare as integers.
    """

    value: str
    sub_sequence: int = 0

    def __attrs_post_init__(self) -> None:
        if not self.value:
            raise ValueError("a checkpoint value cannot be empty")
        if not _is_sequence_number(self.value) and self.value not in Sentinel._value2member_map_:
            raise ValueError(f"not a sequence number or checkpoint sentinel: {self.value!r}")
        if self.sub_sequence < 0:
            raise ValueError(f"sub-sequence number cannot be negative: {self.sub_sequence}")

    @classmethod
    def of(cls, sentinel: Sentinel) -> Checkpoint:
        return cls(sentinel.value)

    @property
    def sentinel(self) -> Sentinel | None:
        return None if _is_sequence_number(self.value) else Sentinel(self.value)

    @property
    def is_sequence(self) -> bool:
        return _is_sequence_number(self.value)

    @property
    def is_shard_end(self) -> bool:
        return self.value == Sentinel.SHARD_END.value

    def sequence_int(self) -> int:
        if not self.is_sequence:
            raise ValueError(f"{self.value} is not a sequence number")
        return int(self.value)

    def key(self) -> tuple[int, int]:
        """An ordering key. Starting sentinels sort first, SHARD_END last."""
        if self.is_sequence:
            return (int(self.value), self.sub_sequence)
        if self.is_shard_end:
            return (1 << 200, 0)
        return (-1, 0)

    def __str__(self) -> str:
        if self.is_sequence and self.sub_sequence:
            return f"{self.value}/{self.sub_sequence}"
        return self.value


TRIM_HORIZON = Checkpoint.of(Sentinel.TRIM_HORIZON)
LATEST = Checkpoint.of(Sentinel.LATEST)
AT_TIMESTAMP = Checkpoint.of(Sentinel.AT_TIMESTAMP)
SHARD_END = Checkpoint.of(Sentinel.SHARD_END)
