"""How far `v-auto`'s steady state is from the best periodic one, under a tight memory limit.

For V cases at tight limits (Zero Bubble's 1.5B p = 8 and 14.6B p = 16 settings at
V-Min's, V-Half's and p/2 activations, and the solver grid's p = 16, m = 64 uniform V case
at V-Min's), this scans periods from the busiest device's work per microbatch upwards
and asks CP-SAT whether a 1-periodic pattern (every microbatch the same ops at the same
offsets, shifted by the period) fits the limit in its steady state, with the exact
steady-state memory (optimizer.exact.periodic.period_status). With `--copies K` the
patterns hold K microbatches per cycle of K periods (microbatches alternate between K
patterns), a larger family: a period proven "none" for one copy may fit with two. Each period ends as
"none" (proven: no such pattern), "pattern" (one fits; its unrolled span is shown) or
"unknown" (the time per period ran out). The scan stops at the first pattern. With
several copies the search is hinted with the first 1-periodic pattern found at these
steps or longer ones (scaled to each period and repeated): a hint never changes what is
proven, only how soon CP-SAT answers.

Beside it: `v-auto`'s own steady state, the median time between its first device's
forwards of the first chunk. A proof of "none" at every period
below v-auto's says no periodic schedule runs a faster steady state at that memory; it is
not a lower bound on the span of every schedule (an aperiodic one, or a warm-up and
cool-down of another shape, may still be shorter).

    python benchmarks/periodic.py [--seconds 20] [--copies 1] [--steps 1,1.05,...] [--only TEXT] [--output PATH]

Results: benchmarks/results/periodic.json and periodic.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.published import published_problem, setting_named
from benchmarks.saving import save_results
from benchmarks.script import run_main
from benchmarks.solver import Case, build_problem
from optimizer.exact.incumbents import objective_value
from optimizer.exact.periodic import Key, period_status, repeated_pattern, unroll
from optimizer.exact.timescale import IntegerTables, integer_tables
from optimizer.ops import SPLIT_KINDS
from optimizer.problem import Problem
from optimizer.schedule import Schedule
from optimizer.schedules import generate
from optimizer.schedules.paced import busiest_work
from optimizer.simulate import simulate

RESULTS = Path(__file__).resolve().parent / "results"
STEPS = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3)
HINT_STEPS = (1.15, 1.2, 1.25, 1.3, 1.4, 1.5, 1.75, 2.0)  # where 1-periodic patterns are sought for a hint


def cases() -> list[tuple[str, Problem]]:
    small, large = setting_named("1.5B-p8-m24"), setting_named("14.6B-p16-m48")
    # The 4-device case of benchmarks/small_proofs.py, where `auto`'s bound leaves most open.
    four = dataclasses.replace(small, p=4, m=12)
    return [
        ("1.5B-p4-m12 V-Min (2)", published_problem(four, 2.0, "vshape")),
        ("1.5B-p8-m24 V-Min (4)", published_problem(small, 4.0, "vshape")),
        ("14.6B-p16-m48 V-Min (6)", published_problem(large, 6.0, "vshape")),
        ("14.6B-p16-m48 p/2 (8)", published_problem(large, 8.0, "vshape")),
        ("14.6B-p16-m48 V-Half (9)", published_problem(large, 9.0, "vshape")),
        ("grid p16-m64 uniform V-Min (6)", build_problem(Case(16, 64, "uniform", "vshape", "vmin"))),
    ]


def steady_period(schedule: Schedule) -> float:
    """The median time between consecutive forwards of the first stage (on the first
    device): the steady state's period, past the warm-up's burst and its wait."""
    starts = [t.start for t in schedule.devices[0] if t.kind == "F" and t.stage == 0]
    return statistics.median(b - a for a, b in zip(starts, starts[1:]))


def one_periodic_pattern(
    problem: Problem, tables: IntegerTables, seconds: float, ticks_of_work: int, steps: tuple[float, ...]
) -> tuple[dict[Key, int], int, float] | None:
    """The first 1-periodic pattern that fits, scanning `steps` and then longer periods up
    to twice the work: (offsets, period in ticks, step), or None."""
    for step in sorted({*steps, *HINT_STEPS}):
        period = math.ceil(ticks_of_work * step)
        status, offsets = period_status(problem, tables, period, time_limit=seconds)
        print(f"  hint: x{step} {status}", flush=True)
        if offsets is not None:
            return offsets, period, step
    return None


def run_case(name: str, problem: Problem, seconds: float, copies: int = 1, steps: tuple[float, ...] = STEPS) -> dict:
    tables = integer_tables(problem)
    work = busiest_work(problem)
    ticks_of_work = max(
        sum(tables.duration[k][s] for k in SPLIT_KINDS for s in range(problem.num_stages) if tables.device[s] == d)
        for d in range(problem.num_devices)
    )
    ours = generate(problem, "v-auto")
    row: dict = {
        "case": name,
        "limit": problem.memory_limit,
        "work_per_microbatch": work,
        "v_auto_span": objective_value(ours, "span"),
        "v_auto_period": steady_period(ours),
        "periods": [],
    }
    single = one_periodic_pattern(problem, tables, seconds, ticks_of_work, steps) if copies > 1 else None
    if single is not None:
        row["hint"] = {"step": single[2], "period": single[1] / tables.time_scale}
    for step in steps:
        period = math.ceil(ticks_of_work * step)
        cycle = copies * period
        hint = repeated_pattern(single[0], single[1], cycle, copies) if single is not None else None
        began = time.monotonic()
        status, offsets = period_status(problem, tables, cycle, time_limit=seconds, copies=copies, hint=hint)
        entry: dict = {"step": step, "period": period / tables.time_scale, "status": status, "seconds": round(time.monotonic() - began, 1)}
        if offsets is not None:
            unrolled = simulate(problem, unroll(problem, offsets, cycle))
            entry.update(span=objective_value(unrolled, "span"), fits=unrolled.fits_memory())
        row["periods"].append(entry)
        print(f"  {name}: x{step} ({entry['period']:.2f}) {status} in {entry['seconds']} s", flush=True)
        if status == "pattern":
            break
    return row


def hint_text(row: dict) -> str:
    hint = row.get("hint")
    return "none found" if hint is None else f"x{hint['step']:g} = {hint['period']:.2f}"


def markdown(rows: list[dict], seconds: float, copies: int = 1) -> str:
    patterns = "1-periodic pattern" if copies == 1 else f"pattern of {copies} microbatches per cycle of {copies} periods"
    hinted = copies > 1  # the searches started from a 1-periodic pattern: one more column
    lines = [
        f"CP-SAT up to {seconds:g} s per period, seed 0, 2 workers, on {platform.machine()} (2 cores). "
        "Periods in ms per microbatch (x: the busiest device's work per microbatch); none: proven "
        f"that no {patterns} fits the limit in its steady state; pattern: the first that fits, "
        "with its unrolled span; unknown: time ran out."
        + (" Hint: the 1-periodic pattern (its period) that started each search." if hinted else ""),
        "",
        "| case | work | v-auto's steady period (median gap) | v-auto span | periods scanned | first pattern (span) |"
        + (" hint |" if hinted else ""),
        "|---|---:|---:|---:|---|---|" + ("---|" if hinted else ""),
    ]
    for r in rows:
        scanned = ", ".join(f"x{p['step']:g} {p['status']}" for p in r["periods"])
        found = next((p for p in r["periods"] if p["status"] == "pattern"), None)
        first = f"x{found['step']:g} = {found['period']:.2f} ({found['span']:.1f})" if found else "-"
        lines.append(
            f"| {r['case']} | {r['work_per_microbatch']:.2f} | {r['v_auto_period']:.2f} "
            f"(x{r['v_auto_period'] / r['work_per_microbatch']:.3f}) | {r['v_auto_span']:.1f} | {scanned} | {first} |"
            + (f" {hint_text(r)} |" if hinted else "")
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="CP-SAT time per period")
    parser.add_argument("--copies", type=int, default=1, help="microbatches per cycle of the patterns (1: 1-periodic)")
    parser.add_argument("--only", default=None, help="run only cases whose name contains this")
    parser.add_argument("--output", type=Path, default=RESULTS / "periodic.json")
    parser.add_argument("--steps", default=",".join(f"{s:g}" for s in STEPS), help="periods to scan, as multiples of the work")
    args = parser.parse_args()
    try:
        steps = tuple(float(text) for text in args.steps.split(","))
    except ValueError:
        parser.error(f"--steps: not a comma-separated list of numbers: {args.steps!r}")
    if args.copies < 1 or not all(math.isfinite(step) and step >= 1 for step in steps):
        parser.error("--copies must be at least 1 and every step a finite number of at least 1")
    rows = []
    for name, problem in cases():
        if args.only and args.only not in name:
            continue
        rows.append(run_case(name, problem, args.seconds, args.copies, steps))
    text = markdown(rows, args.seconds, args.copies)
    print(text)
    save_results(
        args.output, {"seconds_per_period": args.seconds, "copies": args.copies, "machine": platform.machine(), "cases": rows}, text
    )


if __name__ == "__main__":
    run_main(main)
