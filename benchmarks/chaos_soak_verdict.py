"""The chaos soak's verdict (``benchmarks/chaos_soak.py``): what one run measured, whether it
passes, and which cause a duplicate delivery is put down to.

Owns: the result's figures and their JSON form, the growth limits of a long-lived process, and
the attribution of a duplicate to the chaos that explains it. Must not: run processes or talk to
the emulators.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from benchmarks.chaos_soak_fleet import Fleet, Sample

#: A long-lived process is flagged when its RSS grew by more than this fraction and this many
#: MiB (both), or its open descriptors by more than FD_GROWTH.
RSS_GROWTH = 0.25
RSS_GROWTH_MIB = 16.0
FD_GROWTH = 8


@attrs.frozen
class ProcessFigures:
    worker_id: str
    start: Sample
    end: Sample

    @property
    def grew(self) -> bool:
        rss = self.end.rss_mib - self.start.rss_mib
        return (
            rss > RSS_GROWTH_MIB and rss > RSS_GROWTH * self.start.rss_mib
        ) or self.end.fds - self.start.fds > FD_GROWTH


@attrs.frozen
class SoakResult:
    seconds: float
    produced: int
    processed: int  # deliveries, duplicates included
    lost: tuple[int, ...]
    duplicates: dict[str, int]
    actions: dict[str, int]
    reshards: dict[str, int]
    processes: tuple[ProcessFigures, ...]
    drain_seconds: float
    warmup_seconds: float = 0.0
    producer_retries: int = 0
    #: Up to 10 duplicates attributed to planned_move or none, with their workers' events.
    unexplained: tuple[dict[str, Any], ...] = ()
    #: What the fault proxy injected, by kind, and the limit answers it gave, by limit.
    faults: dict[str, int] = attrs.field(factory=dict)
    limit_answers: dict[str, int] = attrs.field(factory=dict)

    @property
    def unattributed(self) -> int:
        return self.duplicates.get("planned_move", 0) + self.duplicates.get("none", 0)

    @property
    def ok(self) -> bool:
        return not self.lost and not self.unattributed and not any(p.grew for p in self.processes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 1),
            "produced": self.produced,
            "processed": self.processed,
            "lost": len(self.lost),
            "lost_ids": list(self.lost[:20]),
            "duplicates": self.duplicates,
            "actions": self.actions,
            "reshards": self.reshards,
            "warmup_seconds": round(self.warmup_seconds, 1),
            "drain_seconds": round(self.drain_seconds, 1),
            "producer_retries": self.producer_retries,
            "faults": self.faults,
            "limit_answers": self.limit_answers,
            "unexplained": list(self.unexplained),
            "processes": [
                {
                    "worker": p.worker_id,
                    "lived_s": round(p.end.at - p.start.at, 1),
                    "rss_mib": [round(p.start.rss_mib, 1), round(p.end.rss_mib, 1)],
                    "fds": [p.start.fds, p.end.fds],
                    "grew": p.grew,
                }
                for p in self.processes
            ],
            "ok": self.ok,
        }


def attribute(
    fleet: Fleet, shard: str, workers: Sequence[str], lost: set[tuple[str, str]], faults: bool
) -> str:
    involved = set(workers)
    if faults and len(involved) == 1 and not involved & (fleet.killed | fleet.stalled):
        return "fault_retry"  # redelivered to its own worker: a checkpoint the faults failed
    if involved & fleet.killed:
        return "kill"
    if involved & fleet.stalled:
        return "stall"
    if any((w, shard) in lost for w in involved):
        return "lease_lost"
    if involved & fleet.stopped:
        return "planned_move"
    return "none"
