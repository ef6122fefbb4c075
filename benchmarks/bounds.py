"""Lower bounds alone, against the best known schedule: how far from optimal, settled in seconds.

For every case of the published suite (benchmarks/solver.py --suite published: the Zero
Bubble paper's 12 settings, linear at limits p and 2p, V at V-Min's and V-Half's levels,
p and 2p) the longest-device-span bound of optimizer.exact.bounds (no solver, no time
limit), the time it took, the best span among the known schedules (every family,
`zb-auto` / `v-auto` and the list policies: `auto`'s starting points) and the gap
between them. A gap of 0.00% proves the schedule named optimal.

    python benchmarks/bounds.py [--only TEXT] [--output PATH]

Results: benchmarks/results/bounds.json and bounds.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.published import published_problem
from benchmarks.saving import save_results, selected
from benchmarks.script import run_main
from benchmarks.solver import PublishedCase, published_cases
from optimizer.exact.bounds import lower_bound
from optimizer.exact.incumbents import generator_candidates, objective_value
from optimizer.exact.listsched import list_schedule, policies
from optimizer.simulate import simulate

RESULTS = Path(__file__).resolve().parent / "results"


def run_case(case: PublishedCase) -> dict:
    problem = published_problem(case.setting, case.limit(), case.placement)
    began = time.monotonic()
    bound = lower_bound(problem, "span")
    seconds = time.monotonic() - began
    known = [(c.name, c.schedule) for c in generator_candidates(problem)[0] if c.fits]
    for policy in policies():
        schedule = simulate(problem, list_schedule(problem, policy))
        if schedule.fits_memory():
            known.append((str(policy), schedule))
    name, best = min(known, key=lambda nc: objective_value(nc[1], "span"))
    span = objective_value(best, "span")
    return {
        "case": case.name,
        "limit": case.limit(),
        "bound": bound.value,
        "reason": bound.reason,
        "bound_seconds": round(seconds, 3),
        "best_known": name,
        "best_span": span,
        "best_bubble": best.metrics.bubble_ratio,
        "gap": max(0.0, (span - bound.value) / span),
    }


def table(results: list[dict]) -> str:
    lines = [
        f"Longest-device-span lower bound (optimizer.exact.bounds, no solver) against the best known schedule "
        f"(families, zb-auto / v-auto, list policies), on {platform.machine()}. Gap of the span.",
        "",
        "| case | limit | best known | its bubble | span | lower bound | s | gap | bound from |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['case']} | {r['limit']:g} | {r['best_known']} | {r['best_bubble']:.2%} | {r['best_span']:.3f} | "
            f"{r['bound']:.3f} | {r['bound_seconds']:.2f} | {r['gap']:.2%} | {r['reason']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only cases whose name contains this text (or one of these, comma-separated)")
    parser.add_argument("--output", type=Path, default=RESULTS / "bounds.json")
    args = parser.parse_args(argv)
    cases = [c for c in published_cases() if selected(c.name, args.only)]
    results = []
    for case in cases:
        r = run_case(case)
        results.append(r)
        print(
            f"{r['case']:<32} best {r['best_bubble']:7.2%} ({r['best_known']})  bound {r['bound']:10.3f} in {r['bound_seconds']:.2f} s  gap {r['gap']:.2%}"
        )
        save_results(args.output, {"results": results}, table(results))
    return 0


if __name__ == "__main__":
    run_main(main)
