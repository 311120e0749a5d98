"""Judge a change of the load planner change by change: what it did where it first acted.

Usage:
    uv run python benchmarks/assignment_trace.py run --out base.json [--set tuning ...]
    uv run python benchmarks/assignment_trace.py compare base.json candidate.json

``run`` plays the shape sets of ``assignment_shapes.py`` with the ``load`` policy (all ten by
default; ``--fresh N`` adds set ``fresh-N``, seeds N*100 to N*100+3, drawn for this and never
tuned on) and writes, per shape, the owner changes the scenario saw and each change's verdict.
``compare`` reads two such files of the same sets, finds per shape the first owner change that
differs, and sorts the changes whose goal (within 1.10x of the optimum in <= 3 runs, and at
most 1.5x the fewest moves + 1) flips: **direct** where that first difference falls in the
change's own window (what the code change did), **after** where the trajectories already
differed before the change began. A planner change moves every later owner, so the "after"
flips go either way; and the sets were the ones every fix so far was judged on, which selected
the base's trajectories among the ones that happened to pass: a change that perturbs them
loses some of that on average whatever it is. The direct flips are the change's own effect.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import assignment_shapes as shapes

from kclasync._simulation.yardstick import SETTLE_FACTOR


def _seeds(name: str) -> dict[str, tuple[int, ...]]:
    if name.startswith("fresh-"):
        base = int(name.split("-", 1)[1]) * 100
        return {
            "small": tuple(range(base, base + 4)),
            "medium": tuple(range(base, base + 3)),
            "hot": tuple(range(base, base + 3)),
            "large": (base,),
        }
    return shapes.SETS[name]


def run(sets: list[str], out: Path) -> None:
    shapes_out: dict[str, Any] = {}
    for name in sets:
        for cls, seeds in _seeds(name).items():
            for seed in seeds:
                (result,) = shapes.run(shapes.case(cls, seed), ["load"], 300.0)
                shapes_out[f"{name} {cls} {seed}"] = {
                    "starts": list(result.change_starts),
                    "owners": [list(entry) for entry in result.owner_log],
                    "verdicts": [
                        [v.change, v.x_final, v.runs, v.moved, v.fewest] for v in result.verdicts
                    ],
                }
        print(f"{name}: done", flush=True)
    out.write_text(json.dumps(shapes_out))


def _passes(verdict: list[Any]) -> bool:
    _, x, runs, moved, fewest = verdict
    return runs is not None and runs <= 3 and x <= SETTLE_FACTOR and moved <= 1.5 * fewest + 1


def _first_difference(a: list[list[Any]], b: list[list[Any]]) -> float | None:
    for left, right in zip(a, b, strict=False):
        if left != right:
            return float(min(left[0], right[0]))
    if len(a) != len(b):
        return float((a if len(a) > len(b) else b)[min(len(a), len(b))][0])
    return None


def flips(base: dict[str, Any], other: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(kind, shape, change, passes now) of every change whose goal flips; kind is "direct"
    where the shape's first differing owner change falls in the change's window, "after"
    where the trajectories differed before it began."""
    if set(base) != set(other):
        raise ValueError("the two runs are not of the same shapes")
    out: list[tuple[str, str, str, bool]] = []
    for key in sorted(base):
        a, b = base[key], other[key]
        first = _first_difference(a["owners"], b["owners"])
        starts = [*a["starts"], float("inf")]
        for i, (va, vb) in enumerate(zip(a["verdicts"], b["verdicts"], strict=True)):
            pa, pb = _passes(va), _passes(vb)
            if first is None or pa == pb or first >= starts[i + 1]:
                continue
            out.append(("direct" if first >= starts[i] else "after", key, va[0], pb))
    return out


def compare(base_path: Path, other_path: Path) -> None:
    base, other = json.loads(base_path.read_text()), json.loads(other_path.read_text())
    found = flips(base, other)
    for kind, key, change, now in found:
        print(f"{kind:6} {key} {change}: {'fixed' if now else 'broken'}")
    passing = [
        sum(_passes(v) for s in run.values() for v in s["verdicts"]) for run in (base, other)
    ]
    total = sum(len(v["verdicts"]) for v in base.values())

    def count(kind: str, now: bool) -> int:
        return sum(1 for k, _, _, n in found if k == kind and n == now)

    print(
        f"both goals: {passing[0]} -> {passing[1]} of {total}"
        f" | direct: {count('direct', True)} fixed, {count('direct', False)} broken"
        f" | after a difference: {count('after', True)} fixed, {count('after', False)} broken"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    runner = sub.add_parser("run")
    runner.add_argument("--out", type=Path, required=True)
    runner.add_argument("--set", action="append", choices=tuple(shapes.SETS), default=[])
    runner.add_argument("--fresh", action="append", type=int, default=[])
    judge = sub.add_parser("compare")
    judge.add_argument("base", type=Path)
    judge.add_argument("other", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        sets = args.set or ([] if args.fresh else list(shapes.SETS))
        run(sets + [f"fresh-{n}" for n in args.fresh], args.out)
    else:
        compare(args.base, args.other)


if __name__ == "__main__":
    main()
