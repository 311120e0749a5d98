"""Deterministic simulation: real ``Consumer`` workers on in-memory adapters in virtual time.

See ``docs/simulation.md``. Entry points: ``run_simulation(SimulationSettings(...))`` and the
``kclasync simulate`` command.
"""

from kclasync._simulation.harness import run_simulation
from kclasync._simulation.report import SimulationReport, format_report
from kclasync._simulation.settings import SimulationSettings

__all__ = ["SimulationReport", "SimulationSettings", "format_report", "run_simulation"]
