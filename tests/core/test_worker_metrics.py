"""The KCL 3.x worker-metrics entry: codec, tolerant parsing, and the leader's liveness rules."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from kclasync._core.workers import worker_metrics as wm
from kclasync._core.workers import worker_metrics_item as wi

#: An entry the Java KCL 3.1.3 wrote (read back from its table in the interop run): no CPU
#: metric available, so empty maps.
JAVA_ITEM = {
    "wid": {"S": "java-1"},
    "opr": {"M": {}},
    "sts": {"M": {}},
    "lut": {"N": "1795456278"},
}


def test_reads_the_java_workers_entry_and_writes_it_back_identically() -> None:
    entry = wi.decode_item(JAVA_ITEM)
    assert entry == wm.WorkerMetrics("java-1", 1795456278)
    assert wi.encode_item(entry) == JAVA_ITEM
    assert wm.uses_default_metric(entry) and wm.is_valid(entry)


def test_cpu_samples_round_trip_with_their_operating_range() -> None:
    entry = wm.WorkerMetrics("w", 100)
    for value in range(12):
        entry = entry.with_sample(wm.CPU, value * 1.5)
    assert entry.metric_stats[wm.CPU] == tuple(v * 1.5 for v in range(2, 12))  # last 10 kept
    assert entry.operating_range == {wm.CPU: (100,)}
    item = wi.encode_item(entry)
    assert item["sts"]["M"]["C"]["L"][0] == {"N": "3.0"}
    assert item["opr"] == {"M": {"C": {"L": [{"N": "100"}]}}}
    assert wi.decode_item(item) == entry


def test_later_kcl_support_fields_are_read_and_kept() -> None:
    item = {**JAVA_ITEM, "sup": {"N": "1"}, "slu": {"N": "1795456000"}}
    entry = wi.decode_item(item)
    assert (entry.support_code, entry.support_last_update) == (1, 1795456000)
    assert wi.encode_item(entry) == item


def test_liveness_follows_the_leaders_two_period_window_in_whole_seconds() -> None:
    entry = wm.WorkerMetrics("w", 1000)
    assert wm.is_live(entry, now=1060.9, report_period=30.0)  # floor(1000.9) = 1000 <= lut
    assert not wm.is_live(entry, now=1061.0, report_period=30.0)
    assert wm.live_workers([entry, wm.WorkerMetrics("x", 900)], 1010.0, 30.0) == {"w"}


def test_invalid_and_failing_entries_are_not_live() -> None:
    no_range = wm.WorkerMetrics("w", 1000, metric_stats={wm.CPU: (10.0,)})
    zero_max = wm.WorkerMetrics("w", 1000, {wm.CPU: (10.0,)}, {wm.CPU: (0,)})
    failing = wm.WorkerMetrics("w", 1000).with_sample(wm.CPU, 5).with_sample(wm.CPU, -1)
    recovered = failing.with_sample(wm.CPU, 7)
    assert not wm.is_valid(no_range) and not wm.is_valid(zero_max)
    assert wm.is_failing(failing) and not wm.is_live(failing, 1000, 30)
    assert wm.is_live(recovered, 1000, 30)


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ({"lut": {"N": "1"}}, "no string wid"),
        ({"wid": {"S": "w"}}, "no lut"),
        ({"wid": {"S": "w"}, "lut": {"S": "yesterday"}}, "lut is not a number"),
        ({"wid": {"S": "w"}, "lut": {"N": "NaN"}}, "lut is not finite"),
        ({"wid": {"S": "w"}, "lut": {"N": "1"}, "sts": {"L": []}}, "sts is not a map"),
        (
            {"wid": {"S": "w"}, "lut": {"N": "1"}, "sts": {"M": {"C": {"L": [{"S": "x"}]}}}},
            "sts.C holds",
        ),
    ],
)
def test_unreadable_items_raise_a_clear_error(item: dict[str, Any], reason: str) -> None:
    with pytest.raises(wi.CorruptWorkerMetricsError, match=reason):
        wi.decode_item(item)


def test_decode_items_skips_and_reports_corrupt_items() -> None:
    decoded = wi.decode_items([JAVA_ITEM, {"wid": {"S": "bad"}}, {**JAVA_ITEM, "wid": {"S": "b"}}])
    assert [e.worker_id for e in decoded.entries] == ["java-1", "b"]
    assert [e.worker_id for e in decoded.corrupt] == ["bad"]


def test_presence_marks_count_unreadable_items_that_name_a_worker_by_their_content() -> None:
    half = {"wid": {"S": "half"}}
    marks = dict(wi.presence_marks(wi.decode_items([JAVA_ITEM, half, {"lut": {"N": "1"}}])))
    assert set(marks) == {"java-1", "half"} and marks["java-1"] == 1795456278
    # The same content gives the same mark (silent); any rewrite gives another (live).
    again = dict(wi.presence_marks(wi.decode_items([dict(half)])))
    changed = dict(wi.presence_marks(wi.decode_items([{**half, "lut": {"S": "?"}}])))
    assert again["half"] == marks["half"] != changed["half"]
    # Map keys in another order, and binary values, digest by content.
    one = {"wid": {"S": "x"}, "sts": {"M": {"C": {"N": "1"}, "M": {"B": b"\x00"}}}}
    other = {"sts": {"M": {"M": {"B": b"\x00"}, "C": {"N": "1"}}}, "wid": {"S": "x"}}
    first, second = (dict(wi.presence_marks(wi.decode_items([i]))) for i in (one, other))
    assert first == second


def test_non_finite_samples_are_refused_on_write() -> None:
    with pytest.raises(ValueError, match="finite"):
        wi.encode_item(wm.WorkerMetrics("w", 1).with_sample(wm.CPU, float("inf")))


def test_legacy_registry_keys_are_exactly_the_prefixed_ones() -> None:
    keys = ["shardId-000000000001", "__worker__:a", "__worker__:b", "x__worker__:c"]
    assert wm.legacy_registry_keys(keys) == ["__worker__:a", "__worker__:b"]


def test_an_entry_naming_throughput_is_on_the_default_metric_even_without_a_range() -> None:
    entry = wm.WorkerMetrics("w", 1000, metric_stats={wm.THROUGHPUT_MARKER: (1.0,)})
    assert wm.uses_default_metric(entry) and wm.is_valid(entry)


def test_cpu_is_reported_unless_a_present_java_worker_reports_no_metric() -> None:
    now = 10_000.0
    java_default = wm.WorkerMetrics(worker_id="java-1", last_update=9_990)
    java_cpu = java_default.with_sample(wm.CPU, 30.0)
    ours_default = wm.WorkerMetrics(worker_id="py-2", last_update=9_999, implementation="kclasync")
    assert wm.may_report_metric([], "py-1", now)
    # A Java worker scored on throughput: the leader could not compare a CPU report with it.
    assert not wm.may_report_metric([java_default], "py-1", now)
    # Java workers that report CPU, kclasync workers without a CPU source: CPU is comparable.
    assert wm.may_report_metric([java_cpu, ours_default], "py-1", now)
    # A Java entry older than two default KCL report periods is a worker that has gone.
    gone = attrs.evolve(java_default, last_update=int(now - 61))
    assert wm.may_report_metric([gone, ours_default], "py-1", now)
    assert not wm.may_report_metric([gone], "py-1", now, present_within=120)


def test_the_kclasync_marker_round_trips_and_java_entries_have_none() -> None:
    ours = wm.WorkerMetrics(worker_id="py-1", last_update=5, implementation=wm.KCLASYNC)
    item = wi.encode_item(ours)
    assert item["impl"] == {"S": "kclasync"}
    assert wi.decode_item(item) == ours
    assert (
        wi.decode_item(wi.encode_item(attrs.evolve(ours, implementation=None))).implementation
        is None
    )


def test_a_leader_counts_a_java_entry_live_for_two_java_report_periods() -> None:
    ours = wm.WorkerMetrics(worker_id="py-1", last_update=1, implementation=wm.KCLASYNC)
    java = wm.WorkerMetrics(worker_id="java-1", last_update=1)
    assert wm.entry_timeout(ours, 11.0) == 11.0
    # A Java worker reports every 30 s by default: an 11 s window would miss it two thirds
    # of the time.
    assert wm.entry_timeout(java, 11.0) == 2 * wm.DEFAULT_REPORT_PERIOD > wm.DEFAULT_REPORT_PERIOD
    assert wm.entry_timeout(java, 90.0) == 90.0
