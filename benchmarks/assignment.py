"""Load-aware assignment, pure model: count-balanced, KCL 3.x (`kcl3`) and kclasync's policy.

A discrete-time model driven only by the pure planners (no runtime, no I/O): one step per
assignment run (leaseAssignmentInterval, 20 s by default). Shards have Zipf-skewed throughput
(the top few 10-50x the median), re-ranked at each traffic change; workers have unequal
capacities (KB/s at 100 % CPU) and report CPU = processed throughput / capacity + noise from a
seeded Random, measured over the previous interval; workers join and one crashes. Each worker
reports an estimate of its capacity from its own CPU and processed bytes (``estimate_capacity``);
only kclasync's policy uses it. Lease throughput is an EMA (alpha 0.5) updated every renewal
period (6 per interval). A move is a graceful handoff: the old owner keeps the lease for the
first renewal period of the next interval. The KCL 3.x leader balances on every 3rd run only
(varianceBalancingFrequency); unowned and expired leases are placed on every run by all three.

Reported per policy (same seed, same events): mean over time of max/mean utilisation and the
worst utilisation seen, for each change the rounds and seconds until every worker is within
+-10 % of the mean utilisation (noise-free), leases moved (rebalancing moves / all ownership
changes) and moves that sent a lease back to the worker it left (A->B->A).

A second, small table is the scale-out case of the issue: 8 equal shards on one worker, then a
second worker joins.

    uv run python benchmarks/assignment.py [--seed 7] [--shards 32] [--rounds 160]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kclasync._core.assignment.kcl3_decider import is_balancing_run, plan_kcl3
from kclasync._core.assignment.load_assignment import (
    FleetSnapshot,
    LeaseLoad,
    Move,
    Plan,
    WorkerLoad,
    estimate_capacity,
)
from kclasync._core.assignment.load_balancer import plan_load_aware

INTERVAL_SECONDS = 20.0
RENEWALS_PER_INTERVAL = 6  # renewer period failover/3 (3.3 s) in a 20 s interval
BAND = 0.10

Planner = Callable[[FleetSnapshot, int], Plan]


def plan_count_balanced(snapshot: FleetSnapshot, run: int) -> Plan:
    """Everyone the same number of leases (the KCL 2.x / balanced taker's end state)."""
    live = sorted(w.worker_id for w in snapshot.workers)
    counts = dict.fromkeys(live, 0)
    mine: dict[str, list[str]] = {w: [] for w in live}
    pending: list[LeaseLoad] = []
    for lease in sorted(snapshot.leases, key=lambda item: item.key):
        if lease.owner in counts and not lease.expired:
            counts[lease.owner] += 1
            if not lease.sticky and not lease.in_handoff:
                mine[lease.owner].append(lease.key)
        else:
            pending.append(lease)
    assignments = []
    for lease in pending:
        target = min(live, key=lambda w: (counts[w], w))
        counts[target] += 1
        assignments.append(Move(lease.key, None, target))
    moves = []
    while live:
        high = max(live, key=lambda w: (counts[w], w))
        low = min(live, key=lambda w: (counts[w], w))
        if counts[high] - counts[low] <= 1 or not mine[high]:
            break
        key = mine[high].pop()
        counts[high] -= 1
        counts[low] += 1
        moves.append(Move(key, high, low))
    return Plan(tuple(assignments), tuple(moves))


def plan_kcl3_run(snapshot: FleetSnapshot, run: int) -> Plan:
    return plan_kcl3(snapshot, balance=is_balancing_run(run), seed=run)


def plan_ours(snapshot: FleetSnapshot, run: int) -> Plan:
    return plan_load_aware(snapshot)


POLICIES: dict[str, Planner] = {
    "count-balanced": plan_count_balanced,
    "kcl3": plan_kcl3_run,
    "load-aware": plan_ours,
}


@dataclass
class Scenario:
    seed: int = 7
    shards: int = 32
    rounds: int = 160
    median_kbps: float = 40.0
    zipf_s: float = 1.2
    noise_percent: float = 1.5
    # (round, event) with events "traffic" (re-rank the hot shards), "join:<capacity>",
    # "crash:<worker>".
    events: tuple[tuple[int, str], ...] = (
        (40, "traffic"),
        (70, "join:3000"),
        (100, "crash:w1"),
        (130, "traffic"),
    )
    capacities: tuple[float, ...] = (3000.0, 2000.0, 1400.0)


@dataclass
class Outcome:
    policy: str
    max_over_mean: float
    worst_util: float
    settle_rounds: list[int | None] = field(default_factory=list)
    rebalance_moves: int = 0
    ownership_changes: int = 0
    back_and_forth: int = 0
    elapsed: float = 0.0


def _shard_rates(rng: random.Random, shards: int, scenario: Scenario) -> list[float]:
    ranks = list(range(1, shards + 1))
    rng.shuffle(ranks)
    median_rank = (shards + 1) / 2
    return [scenario.median_kbps * (median_rank / rank) ** scenario.zipf_s for rank in ranks]


def simulate(policy: str, scenario: Scenario) -> Outcome:
    started = time.perf_counter()
    planner = POLICIES[policy]
    traffic_rng = random.Random(scenario.seed)
    noise_rng = random.Random(scenario.seed * 7919 + 1)
    keys = [f"shardId-{i:012d}" for i in range(scenario.shards)]
    rates = _shard_rates(traffic_rng, scenario.shards, scenario)
    capacity = {f"w{i + 1}": c for i, c in enumerate(scenario.capacities)}
    owner: dict[str, str | None] = dict.fromkeys(keys)
    handoff_from: dict[str, str] = {}  # lease -> old owner, for the interval after a move
    ema: dict[str, float | None] = dict.fromkeys(keys)
    reported_cpu = dict.fromkeys(capacity, 0.0)
    estimated: dict[str, float | None] = dict.fromkeys(capacity)
    last_left: dict[str, str] = {}
    events = dict(scenario.events)
    change_rounds = [0, *sorted(events)]
    util_history: list[dict[str, float]] = []
    ratios: list[float] = []
    outcome = Outcome(policy, 0.0, 0.0)
    expired: set[str] = set()
    for run in range(1, scenario.rounds + 1):
        event = events.get(run - 1)
        if event == "traffic":
            rates = _shard_rates(traffic_rng, scenario.shards, scenario)
        elif event and event.startswith("join:"):
            wid = f"w{len(capacity) + 1}"
            capacity[wid] = float(event.split(":", 1)[1])
            reported_cpu[wid] = 0.0
            estimated[wid] = None
        elif event and event.startswith("crash:"):
            dead = event.split(":", 1)[1]
            capacity.pop(dead, None)
            reported_cpu.pop(dead, None)
            for key, holder in owner.items():
                if holder == dead:
                    expired.add(key)
            for key in [k for k, old in handoff_from.items() if old == dead]:
                del handoff_from[key]
        leases = tuple(
            LeaseLoad(
                key=key,
                owner=owner[key],
                throughput_kbps=ema[key],
                expired=key in expired,
                checkpoint_owner=handoff_from.get(key),
                age_order=0.0,
            )
            for key in keys
        )
        workers = tuple(
            WorkerLoad(
                wid,
                cpu_percent=reported_cpu[wid],
                max_cpu_percent=90.0,
                capacity_kbps=estimated[wid],
            )
            for wid in sorted(capacity)
        )
        plan = planner(FleetSnapshot(leases, workers), run)
        handoff_from = {}
        for move in plan.all:
            if last_left.get(move.lease_key) == move.to_worker and move in plan.moves:
                outcome.back_and_forth += 1
            if move.from_worker is not None and move.from_worker in capacity:
                handoff_from[move.lease_key] = move.from_worker
                last_left[move.lease_key] = move.from_worker
            owner[move.lease_key] = move.to_worker
            expired.discard(move.lease_key)
            outcome.ownership_changes += 1
        outcome.rebalance_moves += len(plan.moves)
        # The interval that follows, one renewal period at a time (the lease EMA is updated
        # on each renewal): a lease in handoff runs on its old owner for the first period.
        processed = dict.fromkeys(capacity, 0.0)
        for period in range(RENEWALS_PER_INTERVAL):
            for i, key in enumerate(keys):
                runner = handoff_from.get(key, owner[key]) if period == 0 else owner[key]
                delivered = rates[i] * (1.0 + traffic_rng.uniform(-0.05, 0.05))
                if runner in processed:
                    processed[runner] += delivered / RENEWALS_PER_INTERVAL
                    previous = ema[key]
                    ema[key] = delivered if previous is None else 0.5 * delivered + 0.5 * previous
        handoff_from = {}
        util = {wid: min(100.0, 100.0 * processed[wid] / capacity[wid]) for wid in capacity}
        util_history.append(util)
        for wid, value in util.items():
            noise = noise_rng.gauss(0.0, scenario.noise_percent)
            reported_cpu[wid] = max(0.0, min(100.0, value + noise))
            estimated[wid] = estimate_capacity(estimated[wid], processed[wid], reported_cpu[wid])
        mean = statistics.fmean(util.values())
        if mean > 0:
            ratios.append(max(util.values()) / mean)
        outcome.worst_util = max(outcome.worst_util, max(util.values()))
    outcome.max_over_mean = statistics.fmean(ratios) if ratios else 0.0
    for index, start in enumerate(change_rounds):
        end = change_rounds[index + 1] if index + 1 < len(change_rounds) else scenario.rounds
        settled: int | None = None
        for offset, util in enumerate(util_history[start:end]):
            mean = statistics.fmean(util.values())
            if mean > 0 and all(abs(v - mean) <= BAND * mean for v in util.values()):
                settled = offset + 1
                break
        outcome.settle_rounds.append(settled)
    outcome.elapsed = time.perf_counter() - started
    return outcome


def compare(scenario: Scenario) -> list[Outcome]:
    return [simulate(name, scenario) for name in POLICIES]


def render(scenario: Scenario, outcomes: list[Outcome]) -> str:
    changes = ["start", *(name for _, name in sorted(scenario.events))]
    lines = [
        f"seed {scenario.seed}, {scenario.shards} shards, {scenario.rounds} runs of "
        f"{INTERVAL_SECONDS:.0f} s, capacities {list(scenario.capacities)} KB/s",
        "settle = assignment runs (seconds) until every worker within +-10% of the mean",
        "",
        "| policy | max/mean util | worst util | "
        + " | ".join(f"settle after {c}" for c in changes)
        + " | rebalance moves | ownership changes | A->B->A |",
        "|---" * (6 + len(changes)) + "|",
    ]
    for o in outcomes:
        settle = [
            "never" if r is None else f"{r} ({r * INTERVAL_SECONDS:.0f} s)" for r in o.settle_rounds
        ]
        lines.append(
            f"| {o.policy} | {o.max_over_mean:.3f} | {o.worst_util:.0f}% | "
            + " | ".join(settle)
            + f" | {o.rebalance_moves} | {o.ownership_changes} | {o.back_and_forth} |"
        )
    return "\n".join(lines)


def scale_out(seed: int) -> Scenario:
    """The issue's reference case: 8 equal shards on one worker, a second one joins."""
    return Scenario(
        seed=seed,
        shards=8,
        rounds=40,
        zipf_s=0.0,
        median_kbps=100.0,
        events=((10, "join:2000"),),
        capacities=(2000.0,),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=160)
    args = parser.parse_args()
    total = 0.0
    for scenario in (
        Scenario(seed=args.seed, shards=args.shards, rounds=args.rounds),
        scale_out(args.seed),
    ):
        outcomes = compare(scenario)
        print(render(scenario, outcomes), end="\n\n")
        total += sum(o.elapsed for o in outcomes)
    print(f"model time: {total:.2f} s")


if __name__ == "__main__":
    main()
