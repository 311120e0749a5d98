"""The chaos soak (``benchmarks/chaos_soak.py``) for 60 seconds against the session's moto.

Four worker processes under a steady producer are SIGKILLed, SIGSTOPped/SIGCONTed and stopped
gracefully. Afterwards no acknowledged record is unprocessed, every duplicate involves a killed
or stalled worker, and the long-lived workers' RSS and open descriptors did not grow past the
soak's limits. The ten-minute run and its figures are in docs/simulation.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.chaos_soak import SoakSettings, run_soak
from kclasync.testing.emulators import LocalAws

pytestmark = [pytest.mark.asyncio, pytest.mark.soak]


@pytest.mark.timeout(420)
async def test_soak_60s(moto: LocalAws, unique_name: str, tmp_path: Path) -> None:
    settings = SoakSettings(
        seconds=60.0, workers=4, long_lived=2, rate=100.0, seed=7, chaos_interval=(1.5, 3.0)
    )
    result = await run_soak(moto, unique_name, tmp_path, settings)
    print(result.as_dict())
    assert result.produced > 3000, "the producer stalled"
    assert sum(result.actions.values()) >= 4, f"too little chaos: {result.actions}"
    assert {"sigkill", "sigstop", "graceful_stop"} <= result.actions.keys(), result.actions
    assert not result.lost, f"{len(result.lost)} records lost, e.g. {result.lost[:10]}"
    assert result.unattributed == 0, f"duplicates without a kill or stall: {result.duplicates}"
    assert len(result.processes) == 2, "a long-lived worker was not sampled twice"
    grown = [p for p in result.processes if p.grew]
    assert not grown, f"resource growth: {grown}"
