"""The recording format and the naming of ownership changes (``kclasync._observations``), and
the dashboard's bounded history built from observations (``_history``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kclasync._observations import (
    CREATED,
    DELETED,
    EXPIRED,
    FIRST_SEEN,
    HANDED_OVER,
    RELEASED,
    SHARD_END,
    STATE_CHANGED,
    TAKEN,
    LeaseRead,
    LeaseTracker,
    RecordingError,
    RecordingWriter,
    parse_recording,
    read_recording,
)
from kclasync.dashboard._history import FleetHistory, replay_document


def reasons(lines: list[dict[str, object]]) -> list[tuple[object, object, object]]:
    return [(line["lease"], line["owner"], line["reason"]) for line in lines]


def test_a_crashed_owner_is_told_from_a_rebalance_by_its_silence() -> None:
    """w-a renews both its leases every second until it crashes; w-b steals one of w-c's
    leases while w-c renews: that is a handover; w-a's leases, taken once w-a fell silent for
    longer than twice its usual renewal gap, were taken after expiry."""
    tracker = LeaseTracker()
    counters = {"s0": 1, "s1": 1, "s2": 1, "s3": 1}
    owners = {"s0": "w-a", "s1": "w-a", "s2": "w-c", "s3": "w-c"}

    def read(t: float, renewing: set[str]) -> list[dict[str, object]]:
        for key, owner in owners.items():
            if owner in renewing:
                counters[key] += 1
        leases = [LeaseRead(k, owners[k], counters[k]) for k in sorted(owners)]
        return tracker.observe(t, leases)

    assert reasons(read(0, set())) == [(k, owners[k], FIRST_SEEN) for k in sorted(owners)]
    for t in range(1, 6):
        assert read(t, {"w-a", "w-c"}) == []
    owners["s3"] = "w-b"
    counters["s3"] += 1
    assert reasons(read(6, {"w-a", "w-c"})) == [("s3", "w-b", HANDED_OVER)]
    for t in (7, 8, 9):  # w-a crashed after t=6: silent
        read(t, {"w-b", "w-c"})
    owners["s0"] = "w-b"
    counters["s0"] += 1
    assert reasons(read(10, {"w-b", "w-c"})) == [("s0", "w-b", EXPIRED)]


def test_release_take_shard_end_sticky_new_and_deleted_leases() -> None:
    tracker = LeaseTracker()
    tracker.observe(0, [LeaseRead("s0", "w-a", 1), LeaseRead("s1", "w-a", 1)])
    lines = tracker.observe(
        1,
        [
            LeaseRead("s0", None, 2),
            LeaseRead("s1", "w-a", 2, state="pinned"),
            LeaseRead("s2", None, 0),
        ],
    )
    assert [(ln["lease"], ln["owner"], ln["state"], ln["reason"]) for ln in lines] == [
        ("s0", None, "normal", RELEASED),
        ("s1", "w-a", "pinned", STATE_CHANGED),
        ("s2", None, "normal", CREATED),
    ]
    lines = tracker.observe(2, [LeaseRead("s0", "w-b", 3), LeaseRead("s2", None, 1, "shard_end")])
    assert reasons(lines) == [("s0", "w-b", TAKEN), ("s2", None, SHARD_END), ("s1", None, DELETED)]


def test_history_keeps_a_bounded_ring_per_lease_and_segments_that_close() -> None:
    history = FleetHistory(segments_per_lease=3, samples=2)
    owners = ["w-a", "w-b", "w-c", "w-d", "w-e"]
    for t, owner in enumerate(owners):
        reason = FIRST_SEEN if t == 0 else HANDED_OVER
        line = {"kind": "lease", "t": t, "lease": "s0", "owner": owner, "state": "normal"}
        touched = history.add([{**line, "reason": reason}])
        if t:
            closed, opened = touched["s0"]
            assert (closed["owner"], closed["end"], closed["ended_by"]) == (
                owners[t - 1],
                t,
                reason,
            )
            assert (opened["owner"], opened["start"], opened["end"]) == (owner, t, None)
    ring = history.document()["timeline"]["s0"]
    assert [s["owner"] for s in ring] == ["w-c", "w-d", "w-e"]
    for t in range(5):
        history.add([{"kind": "workers", "t": t, "workers": {"w-a": {"leases": t}}}])
    assert [s["t"] for s in history.document()["samples"]] == [3, 4]


def test_a_recording_round_trips_and_replays_its_end(tmp_path: Path) -> None:
    path = tmp_path / "fleet.jsonl"
    writer = RecordingWriter(path, "billing", "dashboard")
    tracker = LeaseTracker()
    writer.write_all(tracker.observe(10.0, [LeaseRead("s0", "w-a", 1), LeaseRead("s1", "w-b", 1)]))
    writer.write({"kind": "workers", "t": 10.0, "workers": {"w-a": {"leases": 1}}})
    writer.write_all(tracker.observe(11.0, [LeaseRead("s0", "w-b", 2), LeaseRead("s1", "w-b", 2)]))
    writer.write({"kind": "future-kind", "t": 11.5})
    writer.close()
    recording = read_recording(path)
    assert (recording.application, recording.source) == ("billing", "dashboard")
    assert [line["kind"] for line in recording.observations] == [
        "lease",
        "lease",
        "workers",
        "lease",
    ]
    history = FleetHistory()
    history.add(recording.observations)
    document = replay_document("x", recording, history)
    assert document["application"] == "billing" and document["at"] == 11.0
    assert [(lease["key"], lease["owner"]) for lease in document["leases"]] == [
        ("s0", "w-b"),
        ("s1", "w-b"),
    ]
    assert document["changes"] == [{"at": 11.0, "lease": "s0", "from": "w-a", "to": "w-b"}]
    json.dumps(document)  # the page gets it as JSON


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "is empty: no header line"),
        (["not json"], "line 1: not JSON"),
        (['{"kind": "lease"}'], "line 1: not a kclasync recording"),
        (
            ['{"kind": "header", "format": "kclasync-observations", "version": 9}'],
            "format version 9, this kclasync reads version 1",
        ),
        (
            [
                '{"kind": "header", "format": "kclasync-observations", "version": 1}',
                '{"kind": "lease", "t": 1, "owner": "w"}',
            ],
            "line 2: a lease line needs 'lease' (a string)",
        ),
        (
            [
                '{"kind": "header", "format": "kclasync-observations", "version": 1}',
                '{"kind": "workers", "t": "noon", "workers": {}}',
            ],
            "line 2: a workers line needs a numeric 't'",
        ),
    ],
)
def test_a_bad_recording_names_its_line(lines: list[str], message: str) -> None:
    with pytest.raises(RecordingError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_recording(lines, "f.jsonl")
