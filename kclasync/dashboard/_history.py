"""What the dashboard remembers of the past: each lease's owners over time and each worker's
samples, kept in the dashboard's process (so a reloaded page gets them back) and bounded.

Owns: building the timeline (one segment per owner and state of a lease, a ring per lease) and
the series (a ring of samples) from observations (``kclasync._observations``), live or from a
recording, and their JSON form for the page.
Must not: read the fleet or clocks, or know about HTTP.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from kclasync._observations import Recording

#: Segments kept per lease: a lease that changes hands every minute keeps about 3 hours.
SEGMENTS_PER_LEASE = 200
#: Samples kept: one an interval, 3600 is an hour at the default interval of 1 s.
SAMPLES_KEPT = 3600
#: Ownership changes listed for a recording (its last ones).
CHANGES_SHOWN = 50
#: Leases remembered: deleted leases beyond this are forgotten, oldest first.
LEASES_KEPT = 5000


class FleetHistory:
    """The timeline and the series; memory is O(leases x SEGMENTS_PER_LEASE + samples x
    workers), whatever the run's length."""

    def __init__(
        self, *, segments_per_lease: int = SEGMENTS_PER_LEASE, samples: int = SAMPLES_KEPT
    ) -> None:
        self._segments_per_lease = segments_per_lease
        self.timeline: dict[str, deque[dict[str, Any]]] = {}
        self.samples: deque[dict[str, Any]] = deque(maxlen=samples)
        self._deleted: deque[str] = deque()

    def add(self, observations: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        """Take in observations (in time order); returns, per lease that changed, the segments
        that changed (the one closed and the one opened), for the open pages."""
        touched: dict[str, list[dict[str, Any]]] = {}
        for line in observations:
            kind = line.get("kind")
            if kind == "workers":
                self.samples.append({"t": line["t"], "workers": line["workers"]})
            elif kind == "lease":
                touched.setdefault(line["lease"], []).extend(self._lease(line))
        return touched

    def _lease(self, line: Mapping[str, Any]) -> list[dict[str, Any]]:
        key, t = line["lease"], line["t"]
        ring = self.timeline.get(key)
        if ring is None:
            ring = self.timeline[key] = deque(maxlen=self._segments_per_lease)
        changed = []
        if ring and ring[-1]["end"] is None:
            ring[-1]["end"] = t
            ring[-1]["ended_by"] = line["reason"]
            changed.append(ring[-1])
        if line["state"] == "deleted":
            self._forget_later(key)
            return changed
        segment = {
            "owner": line["owner"],
            "start": t,
            "end": None,
            "state": line["state"],
            "reason": line["reason"],
            "ended_by": None,
        }
        ring.append(segment)
        changed.append(segment)
        return changed

    def _forget_later(self, key: str) -> None:
        self._deleted.append(key)
        while len(self.timeline) > LEASES_KEPT and self._deleted:
            self.timeline.pop(self._deleted.popleft(), None)

    def document(self) -> dict[str, Any]:
        """Everything remembered, for a page that (re)loads."""
        return {
            "timeline": {key: list(ring) for key, ring in sorted(self.timeline.items())},
            "samples": list(self.samples),
        }


def replay_document(
    application: str, recording: Recording, history: FleetHistory
) -> dict[str, Any]:
    """The page's document for a recording: the leases and workers as they were at its end."""
    end = recording.end or 0.0
    leases = []
    for key, ring in sorted(history.timeline.items()):
        if not ring or ring[-1]["end"] is not None:
            continue  # deleted
        last = ring[-1]
        leases.append(
            {
                "key": key,
                "owner": last["owner"],
                "counter": None,
                "checkpoint": "",
                "pending_checkpoint": None,
                "finished": last["state"] == "shard_end",
                "millis_behind_latest": None,
                "records_per_second": None,
                "throughput_kbps": None,
                "checkpoint_age": None,
                "renewal_age": None,
                "sticky": None if last["state"] in ("normal", "shard_end") else last["state"],
                "sticky_mode": None if last["state"] in ("normal", "shard_end") else last["state"],
                "sticky_worker": None,
                "parents": [],
                "children": [],
            }
        )
    owners: dict[str, str | None] = {}
    changes: list[dict[str, Any]] = []
    for line in recording.observations:
        if line["kind"] != "lease":
            continue
        key = line["lease"]
        if key in owners and owners[key] != line["owner"]:
            to = "(deleted)" if line["state"] == "deleted" else line["owner"]
            changes.append({"at": line["t"], "lease": key, "from": owners[key], "to": to})
        owners[key] = line["owner"]
    sample = history.samples[-1]["workers"] if history.samples else {}
    workers = [
        {
            "id": worker,
            "leases": values.get("leases", 0),
            "registered": True,
            "heartbeat_age": None,
            "leader": False,
            "metrics": values if values.get("records_per_second") is not None else None,
        }
        for worker, values in sorted(sample.items())
    ]
    return {
        "application": recording.application or application,
        "table": recording.application or application,
        "at": end,
        "leases": leases,
        "corrupt": [],
        "workers": workers,
        "leader": {"owner": None, "state": "none"},
        "changes": changes[::-1][:CHANGES_SHOWN],
        "errors": [],
        "metrics_sources": sum(1 for w in workers if w["metrics"] is not None),
        "replay": {"source": recording.source, "start": recording.start, "end": end},
        "timeline_update": {},
        "sample": None,
    }
