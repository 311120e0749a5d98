"""The runtime load scenario (``kclasync simulate --load-scenario``) over several seeds: per seed
and policy, the mean max/mean utilisation, the assignment runs until every worker is within
+-10 % of the mean after each change, leases moved and duplicates by cause; then a summary of
how many changes settled in at most two runs and the seeds where ``load`` moved more leases than
``kcl3``. Virtual time: about 10 s of wall time per seed and policy.

    uv run python benchmarks/assignment_seeds.py [--seeds 10] [--policies kcl3,load]
"""

from __future__ import annotations

import argparse

from kclasync._simulation.load_scenario import ScenarioResult, compare_policies


def _cell(seconds: float | None, runs: int | None) -> str:
    if seconds is None:
        return "never"
    return f"{seconds:.0f} s" + ("" if runs is None else f" ({runs})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--policies", default="kcl3,load")
    parser.add_argument("--change-every", type=float, default=600.0)
    args = parser.parse_args()
    policies = tuple(args.policies.split(","))
    results: dict[tuple[int, str], ScenarioResult] = {}
    header = None
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for r in compare_policies(seed=seed, change_every=args.change_every, policies=policies):
            results[(seed, r.policy)] = r
            if header is None:
                header = "| seed | policy | mean max/mean | " + " | ".join(r.changes)
                print(header + " | moved | dup planned | dup unplanned |")
                print("|" + "---|" * (len(r.changes) + 6))
            kinds = r.report.duplicate_kinds
            cells = " | ".join(
                _cell(s, n) for s, n in zip(r.settle_seconds, r.settle_runs, strict=True)
            )
            print(
                f"| {seed} | {r.policy} | {r.max_over_mean:.3f} | {cells} | {r.leases_moved} | "
                f"{kinds.get('after_planned_move', 0)} | {kinds.get('after_unplanned_move', 0)} |",
                flush=True,
            )
    print("\n| policy | changes settled in <= 2 runs | > 2 runs | never | leases moved |")
    print("|---|---|---|---|---|")
    for policy in policies:
        mine = [r for (_, p), r in results.items() if p == policy]
        runs = [n for r in mine for n in r.settle_runs]
        never = sum(s is None for r in mine for s in r.settle_seconds)
        fast = sum(n is not None and n <= 2 for n in runs)
        slow = sum(n is not None and n > 2 for n in runs)
        moved = sum(r.leases_moved for r in mine)
        print(f"| {policy} | {fast}/{len(runs)} | {slow} | {never} | {moved} |")
    if "kcl3" in policies and "load" in policies:
        seeds = sorted({seed for seed, _ in results})
        moved = {key: r.leases_moved for key, r in results.items()}
        worse = [s for s in seeds if moved[(s, "load")] > moved[(s, "kcl3")]]
        print(f"\nseeds where load moved more leases than kcl3: {worse or 'none'}")


if __name__ == "__main__":
    main()
