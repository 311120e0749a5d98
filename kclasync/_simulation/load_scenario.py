"""A load scenario for the fault simulation: skewed shard throughput, workers of unequal
capacity, joins, leaves and a leader crash, run on one seed for several assignment policies.

Owns: the scenario's timeline (``LoadScenario``), the Zipf throughput per shard (re-ranked at
each traffic change), the CPU model (utilisation = throughput processed / capacity + noise,
sampled by each worker's own registry report as its CPU reader), the utilisation samples
and the settle times after each change, and the runs of one seed per policy
(``compare_policies``; their table is ``load_table``'s).
Must not: decide assignments (the workers' own ``Consumer`` does) or check protocol invariants
(``invariants`` does); it only drives and measures.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from kclasync._adapters.cpu_metrics import CpuReader
from kclasync._core.leases.held_lease import HeldState
from kclasync._simulation.clock import run_virtual
from kclasync._simulation.hardware import PER_CORE_KBPS, model_cores
from kclasync._simulation.harness import Simulation
from kclasync._simulation.report import SimulationReport
from kclasync._simulation.settings import SimulationSettings
from kclasync._simulation.worker import SimWorker, now

if TYPE_CHECKING:
    from kclasync._simulation.yardstick import ChangeVerdict

#: Capacities (KB/s at 100 % CPU) given to workers in start order, cycling.
CAPACITIES = (3000.0, 2000.0, 1400.0, 3000.0)
#: Relative band around the mean utilisation that counts as settled.
SETTLE_BAND = 0.10


@attrs.frozen(kw_only=True)
class ScenarioShape:
    """The fleet and traffic of one scenario run. ``capacities`` are given to workers in start
    order, cycling (joiners and restarted workers take the next). ``zipf_s``: the skew of shard
    throughput. ``load_percent``: scale the rates so the starting fleet runs at this mean
    utilisation, the hottest shard at most 80 % of the largest capacity (None: the median shard
    at 20 KB/s). ``hot_percent``: the hottest shard alone at this percent of the smallest
    capacity (above 100: no small worker can carry it). ``per_core_kbps``: each worker's CPU
    source reports CPUs consistent with its capacity at about this KB/s per CPU
    (``hardware.model_cores``); None: no CPU count is reported."""

    capacities: tuple[float, ...] = CAPACITIES
    zipf_s: float = 1.2
    load_percent: float | None = None
    hot_percent: float | None = None
    per_core_kbps: float | None = PER_CORE_KBPS


@attrs.frozen(kw_only=True)
class ScenarioResult:
    policy: str
    max_over_mean: float
    settle_seconds: tuple[float | None, ...]
    #: Per change: the leader's assignment runs until settled (None: never, or no leader loop).
    settle_runs: tuple[int | None, ...]
    #: Per change window: (mean, worst) of max/mean utilisation over the window's samples.
    window_ratios: tuple[tuple[float, float], ...]
    changes: tuple[str, ...]
    leases_moved: int
    report: SimulationReport
    interval: float
    #: Per change, against the best possible assignment (empty unless asked for).
    verdicts: tuple[ChangeVerdict, ...] = ()
    #: Each change's start, and every change of a lease's owner seen (seconds, lease, owner):
    #: two runs are on the same trajectory up to their logs' first difference.
    change_starts: tuple[float, ...] = ()
    owner_log: tuple[tuple[float, str, str], ...] = ()


def zipf_rates(shards: Sequence[str], rng: random.Random, *, s: float = 1.2) -> dict[str, float]:
    """KB/s per shard: Zipf over a random ranking, the median shard at about 20 KB/s."""
    order = list(shards)
    rng.shuffle(order)
    raw = [1.0 / (rank + 1) ** s for rank in range(len(order))]
    median = statistics.median(raw)
    return {shard: 20.0 * r / median for shard, r in zip(order, raw, strict=True)}


class _ModelCpu:
    """A simulated worker's CPU reader (the runtime samples it with each registry report)."""

    source = "load scenario CPU model"

    def __init__(self, scenario: LoadScenario, worker: SimWorker) -> None:
        self._scenario = scenario
        self._worker = worker

    @property
    def cores(self) -> float | None:
        """The worker's CPUs, as a real source tells the CPUs it measures against."""
        return self._scenario.cores(self._worker)

    async def sample(self) -> float:
        util = self._scenario.utilisation(self._worker)
        return min(100.0, max(0.0, util + self._scenario.noise.gauss(0.0, 1.5)))

    async def close(self) -> None:
        return None


class LoadScenario:
    """Drives one ``Simulation``: traffic changes, a join, a graceful leave, a leader crash."""

    def __init__(
        self,
        sim: Simulation,
        *,
        seed: int,
        change_every: float,
        shape: ScenarioShape | None = None,
    ) -> None:
        self.sim = sim
        self.shape = shape or ScenarioShape()
        self.seed = seed
        self.rng = random.Random(seed)
        self.noise = random.Random(seed + 1)
        self.change_every = change_every
        self.rates: dict[str, float] = {}
        self.samples: list[tuple[float, float]] = []  # (time, max/mean)
        self.spread: list[tuple[float, bool]] = []  # (time, every worker within the band)
        self.run_marks: list[tuple[float, int]] = []  # (time, assignment runs so far, fleet-wide)
        self.changes: list[tuple[str, float]] = []
        #: Per change: the rates in force, the lease owners and the moves counted so far.
        self.marks: list[tuple[dict[str, float], dict[str, str | None], int]] = []
        #: Per sample: (time, utilisation per worker), for the yardstick.
        self.utils: list[tuple[float, dict[str, float]]] = []
        self.capacity: dict[str, float] = {}
        self.owners: dict[str, str | None] = {}
        self.moves = 0
        #: Owner changes including first assignments (the yardstick's "leases moved").
        self.owner_changes = 0
        self.owner_log: list[tuple[float, str, str]] = []
        sim.lease_throughput = self.lease_throughput  # type: ignore[attr-defined]
        sim.fleet.cpu_reader_for = self.cpu_reader

    def lease_throughput(self, key: str) -> float:
        return self.rates.get(key, 0.0)

    def _retraffic(self) -> None:
        shards = sorted(sh.shard_id for sh in self.sim.stream.shards)
        shape = self.shape
        rates = zipf_rates(shards, self.rng, s=shape.zipf_s)
        caps = shape.capacities
        start = [caps[i % len(caps)] for i in range(self.sim.settings.workers)]
        if shape.load_percent is not None and rates:
            scale = shape.load_percent / 100 * sum(start) / sum(rates.values())
            scale = min(scale, 0.8 * max(caps) / max(rates.values()))
            rates = {k: v * scale for k, v in rates.items()}
        if shape.hot_percent is not None and rates:
            hottest = max(rates, key=lambda k: (rates[k], k))
            rates[hottest] = shape.hot_percent / 100 * min(caps)
        self.rates = rates

    def _mark(self, change: str) -> None:
        self.changes.append((change, now()))
        owners = {k: lease.owner for k, lease in self.sim.table.leases.items()}
        self.marks.append((dict(self.rates), owners, self.owner_changes))

    def _workers(self) -> list[SimWorker]:
        return [w for w in self.sim.fleet.live_workers() if not w.paused]

    def _capacity(self, worker: SimWorker) -> float:
        if worker.name not in self.capacity:
            caps = self.shape.capacities
            self.capacity[worker.name] = caps[len(self.capacity) % len(caps)]
        return self.capacity[worker.name]

    def cores(self, worker: SimWorker) -> float | None:
        per_core = self.shape.per_core_kbps
        if per_core is None:
            return None
        return model_cores(self._capacity(worker), seed=self.seed, worker=worker.name,
                           per_core_kbps=per_core)  # fmt: skip

    def processed_kbps(self, worker: SimWorker) -> float:
        """What the worker processes: its active leases and those it is handing away (the old
        owner works until it lets go), not those still coming in."""
        consumer = worker.consumer
        coordinator = consumer._coordinator if consumer is not None else None
        if coordinator is None:
            return 0.0
        return sum(
            self.rates.get(k, 0.0)
            for k, h in coordinator.held.items()
            if h.state in (HeldState.ACTIVE, HeldState.OUTGOING)
        )

    def utilisation(self, worker: SimWorker) -> float:
        """The CPU model, noise-free: throughput processed / capacity, in percent."""
        return 100.0 * self.processed_kbps(worker) / self._capacity(worker)

    def cpu_reader(self, worker: SimWorker) -> CpuReader:
        """The worker's CPU source: the model plus Gaussian noise (sd 1.5 points), 0-100."""
        return _ModelCpu(self, worker)

    async def _measure(self, period: float) -> None:
        while True:
            t = now()
            utils = {w.name: self.utilisation(w) for w in self._workers() if w.consumer}
            self.run_marks.append((t, self._assignment_runs()))
            for key, lease in self.sim.table.leases.items():
                before = self.owners.get(key)
                if lease.owner is not None and before != lease.owner:
                    self.owner_log.append((t, key, lease.owner))
                    self.owner_changes += 1
                    self.moves += before is not None
                self.owners[key] = lease.owner
            if utils:
                self.utils.append((t, utils))
                mean = sum(utils.values()) / len(utils)
                if mean > 0:
                    self.samples.append((t, max(utils.values()) / mean))
                    within = all(abs(u - mean) <= SETTLE_BAND * mean for u in utils.values())
                    self.spread.append((t, within))
            await asyncio.sleep(period)

    def _assignment_runs(self) -> int:
        """Leader assignment runs completed by every worker so far (crashed ones included)."""
        total = 0
        for w in self.sim.fleet.workers:
            worker = w.consumer._worker if w.consumer is not None else None
            if worker is not None and worker.assignment is not None:
                total += worker.assignment.runs
        return total

    def _runs_between(self, start: float, end: float) -> int:
        before = [n for t, n in self.run_marks if t <= start]
        upto = [n for t, n in self.run_marks if t <= end]
        return (upto[-1] if upto else 0) - (before[-1] if before else 0)

    def _leader(self) -> SimWorker | None:
        for w in self._workers():
            if w.consumer is not None and w.consumer.is_leader:
                return w
        return None

    async def drive(self) -> None:
        f = self.sim.settings.failover_time
        self._retraffic()
        self._mark("start")
        measure = asyncio.create_task(self._measure(f))
        try:
            step = self.change_every
            await asyncio.sleep(step)
            self._retraffic()
            self._mark("traffic")
            await asyncio.sleep(step)
            self.sim.fleet.start_worker()
            self._mark("join")
            await asyncio.sleep(step)
            leader = self._leader()
            if leader is None and self._workers():
                leader = self._workers()[0]
            if leader is not None:
                self.sim.fleet.crash(leader)
                self._mark("leader crash")
            await asyncio.sleep(step)
            others = [w for w in self._workers() if not (w.consumer and w.consumer.is_leader)]
            if others:
                await self.sim.fleet.graceful_stop(others[-1])
                self._mark("leave")
            await asyncio.sleep(step)
            self._retraffic()
            self._mark("traffic")
            await asyncio.sleep(step)
        finally:
            measure.cancel()

    def window_ratios(self, end: float) -> tuple[tuple[float, float], ...]:
        """Max/mean utilisation over time: per change window, its mean and its worst."""
        bounds = [t for _, t in self.changes] + [end]
        out: list[tuple[float, float]] = []
        for i in range(len(self.changes)):
            window = [r for t, r in self.samples if bounds[i] <= t < bounds[i + 1]]
            if window:
                out.append((sum(window) / len(window), max(window)))
            else:
                out.append((float("nan"), float("nan")))
        return tuple(out)

    def settle_times(self, end: float) -> tuple[float | None, ...]:
        """Seconds from each change until every worker stays within the band (to the next
        change); None when it never did."""
        return tuple(settled for settled, _ in self.settling(end))

    def settling(self, end: float) -> tuple[tuple[float | None, int | None], ...]:
        """Per change: seconds until every worker stays within the band (to the next change),
        and the leader's assignment runs from the change up to then (None without a leader's
        loop); (None, None) when it never settled."""
        out: list[tuple[float | None, int | None]] = []
        bounds = [t for _, t in self.changes] + [end]
        leader_based = self.sim.settings.taker in ("kcl3", "load")
        for i, (_, start) in enumerate(self.changes):
            window = [(t, ok) for t, ok in self.spread if bounds[i] <= t < bounds[i + 1]]
            settled: float | None = None
            for t, ok in window:
                if ok and settled is None:
                    settled = t
                elif not ok:
                    settled = None
            if settled is None:
                out.append((None, None))
            else:
                runs = self._runs_between(start, settled) if leader_based else None
                out.append((settled - start, runs))
        return tuple(out)


def run_load_scenario(
    settings: SimulationSettings,
    *,
    change_every: float,
    shape: ScenarioShape | None = None,
    yardstick: bool = False,
) -> ScenarioResult:
    """One run; with ``yardstick`` each change is also judged against the optimum (needs the
    development dependency highspy; solved after the run, outside virtual time)."""
    holder: list[LoadScenario] = []
    ends: list[float] = []

    async def go() -> ScenarioResult:
        sim = Simulation(settings)
        scenario = LoadScenario(sim, seed=settings.seed, change_every=change_every, shape=shape)
        holder.append(scenario)
        report, _ = await asyncio.gather(sim.run(), scenario.drive())
        ends.append(now())
        ratios = [r for _, r in scenario.samples]
        return ScenarioResult(
            policy=settings.taker,
            max_over_mean=sum(ratios) / len(ratios) if ratios else float("nan"),
            settle_seconds=scenario.settle_times(now()),
            window_ratios=scenario.window_ratios(now()),
            settle_runs=tuple(runs for _, runs in scenario.settling(now())),
            changes=tuple(name for name, _ in scenario.changes),
            leases_moved=scenario.moves,
            report=report,
            interval=settings.consumer_config("x").effective_assignment_interval,
            change_starts=tuple(t for _, t in scenario.changes),
            owner_log=tuple(scenario.owner_log),
        )

    result = run_virtual(go, wall_limit=600)
    if not yardstick:
        return result
    from kclasync._simulation.yardstick import judge

    return attrs.evolve(result, verdicts=tuple(judge(holder[0], ends[0])))


def compare_policies(
    *,
    workers: int = 3,
    shards: int = 24,
    seed: int = 0,
    change_every: float = 600.0,
    policies: Sequence[str] = ("balanced", "kcl3", "load"),
    shape: ScenarioShape | None = None,
    yardstick: bool = False,
) -> list[ScenarioResult]:
    """The scenario on one seed for each policy (faults off: the changes are the scenario's)."""
    out = []
    for policy in policies:
        settings = SimulationSettings(
            workers=workers,
            shards=shards,
            seed=seed,
            taker=policy,
            faults=frozenset(),
            hours=6 * change_every / 3600.0,
            settle_rounds=15,
        )
        out.append(
            run_load_scenario(settings, change_every=change_every, shape=shape, yardstick=yardstick)
        )
    return out


__all__ = [
    "LoadScenario",
    "ScenarioResult",
    "ScenarioShape",
    "compare_policies",
]
