"""Observations of a fleet over time, as JSON lines: the one format that ``kclasync dashboard
--record``, ``kclasync demo`` and ``kclasync simulate --record`` write, and ``kclasync dashboard
--replay`` shows.

A recording is a header line, then observations in time order, each one JSON object per line:

- ``{"kind": "header", "format": "kclasync-observations", "version": 1, "application": ...,
  "source": "dashboard" | "demo" | "simulation"}``
- ``{"kind": "lease", "t": ..., "lease": ..., "owner": ... | null, "state": ..., "reason": ...}``:
  a lease's owner or state changed (``state``: normal, pinned, release, shard_end, deleted;
  ``reason``: one of ``REASONS``).
- ``{"kind": "workers", "t": ..., "workers": {worker: {"leases": n, "records_per_second": ...,
  "max_millis_behind": ..., "renewal_failures": ..., "processor_errors": ...}}}``: one sample
  per read (a value is null when the worker's metrics were not read).

``t`` is Unix seconds (a simulation counts from its own start). Lines of an unknown ``kind`` are
skipped by readers, so later versions can add some.

Owns: the format, the naming of a change (``LeaseTracker``: why a lease changed hands, from
successive reads of the table), and writing and reading the files.
Must not: read clocks or the fleet (times and reads are passed in), or serve anything.
"""

from __future__ import annotations

import json
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import attrs

FORMAT = "kclasync-observations"
VERSION = 1

FIRST_SEEN = "first seen"
CREATED = "created"
TAKEN = "taken"
HANDED_OVER = "handed over"
EXPIRED = "taken after expiry"
RELEASED = "released"
SHARD_END = "shard end"
STATE_CHANGED = "state changed"
DELETED = "deleted"
#: Why a lease line was written. ``handed over``: from an owner that was still renewing its
#: leases (a rebalance, a steal, a graceful handoff); ``taken after expiry``: from an owner that
#: had stopped renewing every lease it held (a crash, a pause, a partition).
REASONS = (
    FIRST_SEEN,
    CREATED,
    TAKEN,
    HANDED_OVER,
    EXPIRED,
    RELEASED,
    SHARD_END,
    STATE_CHANGED,
    DELETED,
)
#: An owner silent for this many times its usual renewal gap (or the time between reads, if
#: longer) is taken to have stopped: renewals come every failover_time / 3, and a lease can only
#: be taken without a handoff after failover_time without one.
SILENCE_FACTOR = 1.5
_GAPS_KEPT = 8


class RecordingError(ValueError):
    """A file that is not a readable recording; says which line and why."""


@attrs.frozen
class LeaseRead:
    """What one read of the table says of one lease."""

    key: str
    owner: str | None
    counter: int
    state: str = "normal"


def lease_state(finished: bool, sticky_mode: str | None) -> str:
    """``shard_end``, ``pinned``, ``release`` or ``normal``."""
    if finished:
        return "shard_end"
    if sticky_mode in ("pinned", "release"):
        return sticky_mode
    return "normal"


def lease_reads(leases: Iterable[Mapping[str, Any]]) -> list[LeaseRead]:
    """The leases of a dashboard document (``FleetView.update``) as ``LeaseRead``s."""
    return [
        LeaseRead(
            key=lease["key"],
            owner=lease["owner"],
            counter=int(lease["counter"]),
            state=lease_state(bool(lease["finished"]), lease.get("sticky_mode")),
        )
        for lease in leases
    ]


def workers_line(t: float, workers: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``workers`` observation of a dashboard document's workers."""
    sample: dict[str, Any] = {}
    for worker in workers:
        m = worker.get("metrics") or {}
        sample[worker["id"]] = {
            "leases": worker["leases"],
            "records_per_second": m.get("records_per_second"),
            "max_millis_behind": m.get("max_millis_behind"),
            "renewal_failures": m.get("renewal_failures"),
            "processor_errors": m.get("processor_errors"),
        }
    return {"kind": "workers", "t": t, "workers": sample}


def lease_line(t: float, key: str, owner: str | None, state: str, reason: str) -> dict[str, Any]:
    return {"kind": "lease", "t": t, "lease": key, "owner": owner, "state": state, "reason": reason}


def change_reason(old_owner: str | None, new: LeaseRead, old_state: str, owner_silent: bool) -> str:
    """Why a lease read differs from the one before (same lease, owner or state changed)."""
    if new.owner == old_owner:
        return SHARD_END if new.state == "shard_end" else STATE_CHANGED
    if new.owner is None:
        return SHARD_END if new.state == "shard_end" else RELEASED
    if old_owner is None:
        return TAKEN
    return EXPIRED if owner_silent else HANDED_OVER


@attrs.define
class _Seen:
    owner: str | None
    counter: int
    state: str


class LeaseTracker:
    """Turns successive reads of a lease table into ``lease`` observations.

    Remembers, per worker, when one of its leases' counters was last seen to move and the usual
    gap between such moves; an owner silent for ``SILENCE_FACTOR`` times that gap (or the time
    between reads, if longer) when it loses a lease lost it to expiry. O(leases) per read."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] | None = None
        self._renewed: dict[str, float] = {}
        self._gaps: dict[str, deque[float]] = {}
        self._last_read: float | None = None

    def _note_renewal(self, worker: str, t: float) -> None:
        previous = self._renewed.get(worker)
        if previous is not None and t > previous:
            self._gaps.setdefault(worker, deque(maxlen=_GAPS_KEPT)).append(t - previous)
        self._renewed[worker] = t

    def _silent(self, worker: str, t: float, read_gap: float) -> bool:
        last = self._renewed.get(worker)
        if last is None:
            return False
        gaps = self._gaps.get(worker)
        usual = statistics.median(gaps) if gaps else 0.0
        return t - last > SILENCE_FACTOR * max(usual, read_gap)

    def observe(self, t: float, leases: Sequence[LeaseRead]) -> list[dict[str, Any]]:
        """The observations of one read at ``t`` (Unix seconds)."""
        read_gap = 0.0 if self._last_read is None else t - self._last_read
        self._last_read = t
        first = self._seen is None
        seen = self._seen if self._seen is not None else {}
        lines: list[dict[str, Any]] = []
        renewed_now = {
            lease.owner
            for lease in leases
            if lease.owner is not None
            and (old := seen.get(lease.key)) is not None
            and old.owner == lease.owner
            and old.counter != lease.counter
        }
        for worker in renewed_now:
            self._note_renewal(worker, t)
        for lease in leases:
            old = seen.get(lease.key)
            if old is None:
                reason = FIRST_SEEN if first else CREATED
                lines.append(lease_line(t, lease.key, lease.owner, lease.state, reason))
                if lease.owner is not None and lease.owner not in self._renewed:
                    self._renewed[lease.owner] = t
            elif old.owner != lease.owner or old.state != lease.state:
                silent = old.owner is not None and self._silent(old.owner, t, read_gap)
                reason = change_reason(old.owner, lease, old.state, silent)
                lines.append(lease_line(t, lease.key, lease.owner, lease.state, reason))
                if lease.owner is not None and lease.owner != old.owner:
                    self._note_renewal(lease.owner, t)  # a take writes the lease too
        keys = {lease.key for lease in leases}
        for key in sorted(set(seen) - keys):
            lines.append(lease_line(t, key, None, "deleted", DELETED))
        self._seen = {lease.key: _Seen(lease.owner, lease.counter, lease.state) for lease in leases}
        owners = {lease.owner for lease in leases}
        for worker in set(self._renewed) - owners:
            if not self._silent(worker, t, read_gap):
                continue
            del self._renewed[worker]  # holds nothing and stopped: forget it
            self._gaps.pop(worker, None)
        return lines


def header(application: str, source: str) -> dict[str, Any]:
    return {
        "kind": "header",
        "format": FORMAT,
        "version": VERSION,
        "application": application,
        "source": source,
    }


class RecordingWriter:
    """Appends observations to a recording, one line each, flushed as written (a recording cut
    short by a crash or Ctrl-C is still readable up to its last line)."""

    def __init__(self, path: str | Path, application: str, source: str) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = self.path.open("w", encoding="utf-8")
        self.write(header(application, source))

    def write(self, observation: Mapping[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(observation, separators=(",", ":")) + "\n")
        self._file.flush()

    def write_all(self, observations: Iterable[Mapping[str, Any]]) -> None:
        for observation in observations:
            self.write(observation)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@attrs.frozen
class Recording:
    application: str
    source: str
    observations: Sequence[Mapping[str, Any]]

    @property
    def start(self) -> float | None:
        """The time of the first observation."""
        return self.observations[0]["t"] if self.observations else None

    @property
    def end(self) -> float | None:
        """The time of the last observation."""
        return self.observations[-1]["t"] if self.observations else None


def _check(line: Mapping[str, Any], number: int) -> None:
    kind = line.get("kind")
    if not isinstance(line.get("t"), (int, float)):
        raise RecordingError(f"line {number}: a {kind} line needs a numeric 't'")
    if kind == "lease":
        if not isinstance(line.get("lease"), str):
            raise RecordingError(f"line {number}: a lease line needs 'lease' (a string)")
        if not isinstance(line.get("owner"), (str, type(None))):
            raise RecordingError(f"line {number}: 'owner' must be a string or null")
    elif kind == "workers" and not isinstance(line.get("workers"), dict):
        raise RecordingError(f"line {number}: a workers line needs 'workers' (an object)")


def parse_recording(lines: Iterable[str], name: str = "recording") -> Recording:
    """Read a recording's lines; raises ``RecordingError`` naming the first bad line."""
    observations: list[Mapping[str, Any]] = []
    head: Mapping[str, Any] | None = None
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except ValueError as exc:
            raise RecordingError(f"{name} line {number}: not JSON ({exc})") from None
        if not isinstance(line, dict):
            raise RecordingError(f"{name} line {number}: not a JSON object")
        if head is None:
            if line.get("kind") != "header" or line.get("format") != FORMAT:
                raise RecordingError(
                    f"{name} line {number}: not a kclasync recording (its first line must be "
                    f'{{"kind": "header", "format": "{FORMAT}", ...}})'
                )
            if line.get("version") != VERSION:
                raise RecordingError(
                    f"{name}: format version {line.get('version')!r}, this kclasync reads "
                    f"version {VERSION}"
                )
            head = line
            continue
        if line.get("kind") not in ("lease", "workers"):
            continue
        try:
            _check(line, number)
        except RecordingError as exc:
            raise RecordingError(f"{name} {exc}") from None
        observations.append(line)
    if head is None:
        raise RecordingError(f"{name} is empty: no header line")
    observations.sort(key=lambda line: line["t"])
    return Recording(str(head.get("application", "")), str(head.get("source", "")), observations)


def read_recording(path: str | Path) -> Recording:
    """The recording in ``path`` (``OSError`` if it cannot be opened)."""
    with Path(path).open(encoding="utf-8") as file:
        return parse_recording(file, str(path))
