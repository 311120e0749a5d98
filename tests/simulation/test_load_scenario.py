"""The load scenario (skewed shards, unequal workers, join, leave, leader crash) on a small
fleet: every policy keeps the invariants, planned moves duplicate nothing, and the report
compares them."""

from __future__ import annotations

from kclasync._simulation import format_report
from kclasync._simulation.load_scenario import compare_policies
from kclasync._simulation.load_table import format_comparison


def test_small_load_scenario_keeps_the_invariants_for_every_policy() -> None:
    results = compare_policies(workers=3, shards=8, change_every=120.0)
    assert [r.policy for r in results] == ["balanced", "kcl3", "load"]
    for r in results:
        assert r.report.violation_count == 0, format_report(r.report)
        assert r.report.records_processed >= r.report.records_produced > 0
        assert set(r.report.duplicate_kinds) <= {"after_unplanned_move"}, format_report(r.report)
        assert r.changes == ("start", "traffic", "join", "leader crash", "leave", "traffic")
        assert len(r.settle_seconds) == len(r.changes)
        assert r.max_over_mean >= 1.0
    table = format_comparison(results)
    assert table.count("\n") == 10 and table.count("| load |") == 2
