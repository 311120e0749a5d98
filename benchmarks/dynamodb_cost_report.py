"""The table and the plot of ``dynamodb_cost``'s points.

Owns: the Markdown table and the matplotlib figure (monthly cost against fleet size per taker,
with the cost projected from the per-worker rates). Must not: run anything.
"""

from __future__ import annotations

from typing import Any

from dynamodb_units import projected_month


def _f(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def table(points: list[dict[str, Any]]) -> str:
    head = (
        "| taker | workers x shards | write units / lease-h | read units / lease-h "
        "| of which registry | fleet $ / month | failover median / p99 | leases moved |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for p in points:
        if not p["finished"]:
            reached = p["virtual_seconds_reached"]
            where = "under 5" if reached < 5 else f"{reached:.0f}"
            rows.append(
                f"| {p['taker']} | {p['workers']} x {p['shards']} | not finished in "
                f"{p['wall_seconds']:.0f} s (reached {where} virtual s) | | | | | |"
            )
            continue
        u = p["units_per_lease_hour"]
        reg = u.get("registry scan R", 0.0) + u.get("registry get R", 0.0)
        rows.append(
            f"| {p['taker']} | {p['workers']} x {p['shards']} "
            f"| {p['write_units_per_lease_hour']:,.0f} | {p['read_units_per_lease_hour']:,.0f} "
            f"| {reg:,.0f} | {p['fleet_month_dollars']:,.2f} "
            f"| {_f(p['failover_median'])} / {_f(p['failover_p99'])} x | {p['leases_moved']} |"
        )
    return "\n".join(rows)


def plot(points: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = plt.get_cmap("tab10")
    for i, taker in enumerate(dict.fromkeys(p["taker"] for p in points)):
        mine = sorted(
            (p for p in points if p["taker"] == taker and p["finished"]),
            key=lambda p: p["workers"],
        )
        if mine:
            ax.plot(
                [p["workers"] for p in mine],
                [p["fleet_month_dollars"] for p in mine],
                marker="o",
                color=colors(i),
                label=f"{taker} (simulated)",
            )
    sizes = [10, 20, 30, 50, 100, 200, 300, 500, 1000]
    projections = (
        ("early", "kcl2/balanced", "black"),
        ("noef", "kcl2/balanced -noef", "peru"),
        ("leader", "kcl3/load", "green"),
    )
    for family, name, color in projections:
        ax.plot(
            sizes,
            [projected_month(family, w, 10 * w) for w in sizes],
            linestyle="--",
            linewidth=0.9,
            color=color,
            label=f"{name} (projected from the rates)",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("workers (shards = 10 x workers)")
    ax.set_ylabel("US $ per month, whole fleet (on-demand)")
    ax.set_title("DynamoDB cost of the lease protocol by taker (checkpoints excluded)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
