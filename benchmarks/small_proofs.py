"""Small pipelines at tight memory: how often `auto` proves its span optimal, and its gap.

Zero Bubble's profiled per-stage times (benchmarks/published.py) on 4 devices (or
`--devices`), with 8 and 12 microbatches (or `--microbatches`): the V placement at
V-Min's level, V-Half's level and p, and the linear placement at V-Min's level. These are the sizes where the exact models can
settle the question (a few hundred ops), so they show the bound side of the solver: at
p >= 8 the published suite's gaps at these levels are mostly the bound's, and here the
whole problem can be checked. Longest device span (the paper's objective), `auto` at
`--time-limit` seconds, seed 0, 2 workers.

    python benchmarks/small_proofs.py [--time-limit 30] [--devices 4] [--microbatches 8,12]
                                      [--only TEXT] [--output PATH]

Results: benchmarks/results/small_proofs.json and small_proofs.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.published import published_problem, setting_named
from benchmarks.saving import save_results
from benchmarks.script import run_main
from optimizer.exact import SolveOptions, solve
from optimizer.exact.bounds import lower_bound
from optimizer.exact.incumbents import objective_value
from optimizer.schedules import generate

RESULTS = Path(__file__).resolve().parent / "results"
SETTING_NAMES = ("1.5B-p8-m24", "14.6B-p16-m48")
# (placement, level): limits in a device's activations, as in the published suite.
LEVELS = (("vshape", "vmin"), ("vshape", "vhalf"), ("vshape", "p"), ("linear", "vmin"))


def limit_of(level: str, p: int) -> float:
    return float({"vmin": (p + 4) // 3, "vhalf": (p + 2) // 2, "p": p}[level])


def case_name(setting_name: str, p: int, m: int, placement: str, level: str) -> str:
    return f"{setting_name.split('-')[0]}-p{p}-m{m}-{placement}-mem{level}"


def run_case(setting_name: str, p: int, m: int, placement: str, level: str, time_limit: float, seed: int) -> dict:
    setting = dataclasses.replace(setting_named(setting_name), p=p, m=m)
    problem = published_problem(setting, limit_of(level, p), placement)
    ours = "v-auto" if placement == "vshape" else "zb-auto"
    start = generate(problem, ours)
    began = time.monotonic()
    best = solve(problem, "auto", SolveOptions(time_limit=time_limit, seed=seed, threads=2, objective="span"))
    return {
        "case": case_name(setting_name, p, m, placement, level),
        "ops": problem.num_ops,
        "limit": problem.memory_limit,
        "automatic_scheduler": ours,
        "automatic_span": objective_value(start, "span") if start.fits_memory() else None,
        "static_bound": lower_bound(problem, "span").value,
        "auto_span": objective_value(best, "span"),
        "lower_bound": best.metrics.lower_bound,
        "gap": best.metrics.gap,
        "status": best.metrics.status,
        "won_by": best.metrics.method_won,
        "seconds": round(time.monotonic() - began, 1),
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(results: list[dict], time_limit: float) -> str:
    lines = [
        f"Zero Bubble's per-stage times; longest device span in ms; `auto` at {time_limit:g} s, seed 0, "
        f"2 workers, on {platform.machine()}. Static bound: the problem's lower bound before any model runs.",
        "",
        "| case | ops | limit | v-auto / zb-auto | auto | static bound | lower bound | gap | status | won by | s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['case']} | {r['ops']} | {r['limit']:g} | {_ms(r['automatic_span'])} | {_ms(r['auto_span'])} | "
            f"{_ms(r['static_bound'])} | {_ms(r['lower_bound'])} | {r['gap']:.2%} | {r['status']} | {r['won_by']} | "
            f"{r['seconds']:.0f} |"
        )
    proven = sum(r["status"] == "optimal" or r["gap"] <= 1e-6 for r in results)
    lines += ["", f"Proven optimal (gap <= 1e-6: the time grid's rounding): {proven} of {len(results)}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds for each auto run")
    parser.add_argument("--devices", type=int, default=4, help="pipeline devices")
    parser.add_argument("--microbatches", default="8,12", help="comma-separated microbatch counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="run only cases whose name contains this text")
    parser.add_argument("--output", type=Path, default=RESULTS / "small_proofs.json")
    args = parser.parse_args(argv)
    results: list[dict] = []
    for name in SETTING_NAMES:
        for m in (int(v) for v in args.microbatches.split(",")):
            for placement, level in LEVELS:
                if args.only not in case_name(name, args.devices, m, placement, level):
                    continue
                r = run_case(name, args.devices, m, placement, level, args.time_limit, args.seed)
                results.append(r)
                print(
                    f"{r['case']:<32} {r['automatic_scheduler']} {_ms(r['automatic_span']):>7} auto {_ms(r['auto_span']):>7} "
                    f"bound {_ms(r['lower_bound']):>7} (static {_ms(r['static_bound'])}) gap {r['gap']:.2%} {r['status']}",
                    flush=True,
                )
                # Saved after every case, so that a run stopped early keeps what it measured.
                save_results(
                    args.output, {"time_limit": args.time_limit, "seed": args.seed, "results": results}, table(results, args.time_limit)
                )
    return 0


if __name__ == "__main__":
    run_main(main)
