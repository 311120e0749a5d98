"""Shards as the stream describes them: ids, lineage, hash-key and sequence ranges.

Owns: the ``Shard`` value the stream adapters produce and the planners consume.
Must not: do I/O.
"""

from __future__ import annotations

import attrs

MAX_HASH_KEY = (1 << 128) - 1


@attrs.frozen
class HashRange:
    """An inclusive range of 128-bit hash keys."""

    start: int
    end: int

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.start <= self.end <= MAX_HASH_KEY:
            raise ValueError(f"bad hash key range {self.start}..{self.end}")

    @classmethod
    def parse(cls, start: str, end: str) -> HashRange:
        return cls(int(start), int(end))


@attrs.frozen
class Shard:
    """One shard of a stream. ``ending_sequence`` is None while the shard is open."""

    shard_id: str
    parent_shard_id: str | None = None
    adjacent_parent_shard_id: str | None = None
    hash_range: HashRange = HashRange(0, MAX_HASH_KEY)
    starting_sequence: str = "0"
    ending_sequence: str | None = None

    @property
    def is_open(self) -> bool:
        return self.ending_sequence is None

    @property
    def parent_ids(self) -> tuple[str, ...]:
        return tuple(p for p in (self.parent_shard_id, self.adjacent_parent_shard_id) if p)
