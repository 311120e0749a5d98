"""The load scenario's comparison, as Markdown: per policy, settling, moves and lease-table
calls, then max/mean utilisation in each change window.

Owns: ``format_comparison``. Must not: run scenarios (``load_scenario`` does) or judge them.
"""

from __future__ import annotations

from collections.abc import Sequence

from kclasync._simulation.load_scenario import ScenarioResult


def format_comparison(results: Sequence[ScenarioResult]) -> str:
    """Two Markdown tables: settling, moves and lease-table calls per policy; then max/mean
    utilisation over time (mean and worst in each change window)."""
    if not results:
        return ""
    changes = results[0].changes
    head = "| policy | mean max/mean util | " + " | ".join(f"settle after {c}" for c in changes)
    head += " | leases moved | duplicates | reads/lease-h (items) | writes/lease-h |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        settle = " | ".join(
            "never" if s is None else f"{s:.0f} s" + ("" if n is None else f" ({n} runs)")
            for s, n in zip(r.settle_seconds, r.settle_runs, strict=True)
        )
        rep = r.report
        lines.append(
            f"| {r.policy} | {r.max_over_mean:.3f} | {settle} | {r.leases_moved} | "
            f"{rep.duplicates} | {rep.lease_reads_per_lease_hour:.0f} "
            f"({rep.lease_items_scanned_per_lease_hour:.0f}) | "
            f"{rep.lease_writes_per_lease_hour:.0f} |"
        )
    head = "| policy (max/mean util: mean / worst) | " + " | ".join(f"after {c}" for c in changes)
    lines += ["", head + " |", "|" + "---|" * (len(changes) + 1)]
    for r in results:
        cells = " | ".join(f"{mean:.2f} / {worst:.2f}" for mean, worst in r.window_ratios)
        lines.append(f"| {r.policy} | {cells} |")
    return "\n".join(lines)


__all__ = ["format_comparison"]
