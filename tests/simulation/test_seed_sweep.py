"""The seed sweep CI runs: 200 seeds of a small fleet with every fault, in two processes.

Fails on any invariant violation and on any runtime error (an ERROR record logged by a
worker, which includes every unexpected exception of a pipeline or loop). Half the seeds use
the KCL 2.x taker, half the balanced one. About 0.2 CPU seconds a seed (measured on a loaded
2-core machine: 10 seeds in 2 CPU seconds), so about 45 CPU seconds in all.
"""

from __future__ import annotations

import pytest

from kclasync._simulation.faults import ALL_FAULTS
from kclasync._simulation.settings import SimulationSettings
from kclasync._simulation.sweep import SeedResult, SweepSummary, percentile, sweep

SEEDS_PER_TAKER = 100


# The bound is for a machine shared with other jobs; on 2 idle cores each half takes ~15 s.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("taker", ["kcl2", "balanced"])
def test_a_sweep_of_seeds_has_no_violation_and_no_runtime_error(taker: str) -> None:
    base = SimulationSettings(
        workers=3,
        shards=6,
        hours=0.05,
        seed=20_000,
        faults=ALL_FAULTS,
        fault_rate=6.0,
        taker=taker,
    )
    summary = sweep(base, SEEDS_PER_TAKER, jobs=2, wall_limit=300)
    print(summary.format())
    assert summary.seeds == SEEDS_PER_TAKER
    assert not summary.violations, summary.format()
    assert not summary.runtime_errors, summary.format()
    # The faults happened: workers crashed or paused and their leases failed over.
    assert len(summary.failovers) > SEEDS_PER_TAKER
    median, _, worst = summary.failover_stats()
    assert median is not None and worst is not None
    # Every failover completed, within a protocol bound: measured max 3.2 x (kcl2) and 2.9 x
    # (balanced) over these seeds (docs/simulation.md); the bound is the documented "within
    # 4 x in every seed swept". The balanced taker once reached 8.1 x here (seed 20062).
    assert sum(r.failovers_pending for r in summary.results) == 0, summary.format()
    assert worst < 4, summary.format()


def test_a_runtime_error_fails_the_sweep() -> None:
    ok = SeedResult(1, {}, (), {}, (1.0, 1.5), 0, {}, 0.1)
    bad = SeedResult(2, {}, (), {"kclasync._consumer: boom": 1}, (2.0,), 0, {"x": 3}, 0.1)
    summary = SweepSummary(SimulationSettings(), (ok, bad), 1.0)
    assert summary.failed_seeds == (2,)
    assert summary.failover_stats() == (1.5, 2.0, 2.0)
    assert summary.worst() == (2, 2.0)
    assert "runtime errors: 1" in summary.format()
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([], 99) is None
