"""The V placement below V-Min's memory and up to V-Half's: the `paced` family's place.

V-Min (a third of 1F1B's activation memory) is the least any published V schedule needs;
a user whose memory is shorter still wants a schedule. For Zero Bubble's 1.5B (p = 8,
m = 24), 14.6B (p = 16, m = 48) and 28.3B (p = 32, m = 96) settings (benchmarks/published.py)
on the V placement, at half and three quarters of V-Min's level, one activation below it,
at it and at V-Half's: `v-auto`, the list scheduler (`greedy`), `paced`, and `auto` at one
time limit with the paced family left out and with it, side by side in one run, with the
lower bound and gap of the second. Spans are the longest device span (the paper's
objective), in ms; limits in microbatch activations per device (M_B).

    python benchmarks/below_vmin.py [--time-limit 5] [--only TEXT] [--output PATH]

Results: benchmarks/results/below_vmin.json and below_vmin.md.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.published import Setting, published_problem, setting_named
from benchmarks.saving import cores, save_results, selected
from benchmarks.script import run_main
from optimizer.errors import InfeasibleError
from optimizer.exact import SolveOptions, portfolio, solve
from optimizer.exact.incumbents import objective_value
from optimizer.schedules import GENERATORS, generate

RESULTS = Path(__file__).resolve().parent / "results"
SETTING_NAMES = ("1.5B-p8-m24", "14.6B-p16-m48", "28.3B-p32-m96")
FAMILIES = ("v-auto", "greedy", "paced")


def limits_of(p: int) -> list[int]:
    v_min, v_half = (p + 4) // 3, (p + 2) // 2
    return sorted({max(1, math.ceil(v_min / 2)), max(1, round(3 * v_min / 4)), v_min - 1, v_min, v_half})


@contextlib.contextmanager
def without_paced() -> Iterator[None]:
    """`auto` as it was before the paced family: the registry without it, and the solver
    never below V-Min's memory (where it builds the family first)."""
    removed = GENERATORS.pop("paced")
    below = portfolio._below_v_min
    portfolio._below_v_min = lambda problem: False
    try:
        yield
    finally:
        GENERATORS["paced"] = removed
        portfolio._below_v_min = below


def family_span(problem, name: str) -> float | None:
    try:
        schedule = generate(problem, name)
    except InfeasibleError:
        return None
    return objective_value(schedule, "span") if schedule.fits_memory() else None


def run_case(setting: Setting, limit: int, time_limit: float, seed: int) -> dict:
    problem = published_problem(setting, float(limit), "vshape")
    row: dict = {"setting": setting.name, "limit": limit}
    for name in FAMILIES:
        began = time.monotonic()
        row[name] = family_span(problem, name)
        row[f"{name}_seconds"] = round(time.monotonic() - began, 2)
    options = SolveOptions(time_limit=time_limit, seed=seed, threads=2, objective="span")
    with without_paced():
        before = solve(problem, "auto", options)
    after = solve(problem, "auto", options)
    row["auto_without_paced"] = objective_value(before, "span")
    row["auto"] = objective_value(after, "span")
    row["lower_bound"] = after.metrics.lower_bound
    row["gap"] = after.metrics.gap
    row["won_by"] = after.metrics.method_won
    return row


def _span(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(rows: list[dict], time_limit: float) -> str:
    lines = [
        f"The V placement below V-Min's memory, Zero Bubble's settings; longest device span in ms (the paper's objective); "
        f"`auto` at {time_limit:g} s without the paced family and with it, in one run, seed 0, 2 workers, on "
        f"{platform.machine()} ({cores()} cores). Limit in microbatch activations per device; -: nothing fits.",
        "",
        "| setting | limit | v-auto | greedy | paced | auto without paced | auto | gain | lower bound | gap | won by |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        gain = (r["auto_without_paced"] - r["auto"]) / r["auto_without_paced"]
        gap = "-" if r["gap"] is None else f"{r['gap']:.2%}"
        bound = "-" if r["lower_bound"] is None else f"{r['lower_bound']:.1f}"
        lines.append(
            f"| {r['setting']} | {r['limit']} | {_span(r['v-auto'])} | {_span(r['greedy'])} | {_span(r['paced'])} | "
            f"{r['auto_without_paced']:.1f} | {r['auto']:.1f} | {gain:.1%} | {bound} | {gap} | {r['won_by']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=5.0, help="Seconds for each `auto` run (default 5).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="Run only the cases whose name contains one of these comma-separated texts.")
    parser.add_argument("--output", type=Path, default=RESULTS / "below_vmin.json", help="JSON results (the table beside it, .md).")
    args = parser.parse_args()
    rows = []
    for name in SETTING_NAMES:
        setting = setting_named(name)
        for limit in limits_of(setting.p):
            if not selected(f"{name}-limit{limit}", args.only):
                continue
            row = run_case(setting, limit, args.time_limit, args.seed)
            print(row, flush=True)
            rows.append(row)
    text = table(rows, args.time_limit)
    print(text)
    save_results(args.output, {"time_limit": args.time_limit, "machine": platform.machine(), "cases": rows}, text)


if __name__ == "__main__":
    run_main(main)
