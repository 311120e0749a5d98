"""Records as handed to processors."""

from __future__ import annotations

from datetime import datetime

import attrs


@attrs.frozen(slots=True)
class Record:
    """One stream record.

    ``sub_sequence_number`` is non-zero only for user records unpacked from a KPL-aggregated
    record; they share the aggregated record's ``sequence_number``.
    """

    data: bytes
    partition_key: str
    sequence_number: str
    shard_id: str
    sub_sequence_number: int = 0
    approximate_arrival: datetime | None = None
    stream: str | None = None

    @property
    def position(self) -> tuple[int, int]:
        return (int(self.sequence_number), self.sub_sequence_number)
