"""Simulator and validator benchmark: how long timing and checking a large schedule takes.

For p = 32 devices and m = 256 microbatches (the largest scale of the solver benchmark),
each case builds one schedule family's op orders, then measures, as the median of
`--repeats` runs:

* simulate: ASAP times from the orders (optimizer.simulate.simulate_times);
* validate: every rule checked on the timed schedule (optimizer.validate.validate);
* metrics: makespan, bubble and per-device memory peaks (optimizer.schedule.compute_metrics).

Cases: 1F1B (fused backward, 16k ops), ZB-H1 (split backward, 25k ops) with uniform and
with heterogeneous stage times, and ZB-V on the V placement (49k ops). The target is
simulate under 1 s for the 25k-op schedule. Prints a table and writes
benchmarks/results/simulate.json.

    python benchmarks/simulate.py [--devices 32] [--microbatches 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from benchmarks.script import run_main
from optimizer.io import write_json_atomic
from optimizer.problem import Problem, uniform_problem
from optimizer.schedule import compute_metrics
from optimizer.schedules import get_generator
from optimizer.simulate import simulate_times
from optimizer.validate import validate

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_SECONDS = 1.0


def heterogeneous(problem: Problem) -> Problem:
    """First stage x1.2 (embedding), last stage F x1.5, B x2 (vocabulary and loss)."""
    data = problem.model_dump(mode="json")
    first, last = data["stages"][0], data["stages"][-1]
    for key in ("forward", "backward_input", "backward_weight"):
        first[key] *= 1.2
    last["forward"] *= 1.5
    last["backward_input"] *= 2.0
    return Problem.model_validate(data)


def cases(p: int, m: int) -> list[tuple[str, str, Problem]]:
    linear = uniform_problem(p, m, 1.0, 1.0, 0.6, comm_time=0.03)
    vshape = uniform_problem(p, m, 0.5, 0.5, 0.3, comm_time=0.03, placement="vshape", mem_forward=0.5)
    return [
        ("1f1b", "uniform", linear),
        ("zb-h1", "uniform", linear),
        ("zb-h1", "heterogeneous", heterogeneous(linear)),
        ("zb-v", "uniform", vshape),
    ]


def median_seconds(action: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        action()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def run(p: int, m: int, repeats: int) -> list[dict]:
    rows = []
    for family, timing, problem in cases(p, m):
        orders = get_generator(family).build(problem)
        timed = simulate_times(problem, orders)
        violations = validate(problem, timed)
        if violations:
            raise SystemExit(f"{family}: the generated schedule is invalid: {violations[0]}")
        rows.append(
            {
                "family": family,
                "timing": timing,
                "devices": p,
                "microbatches": m,
                "ops": sum(len(ops) for ops in orders),
                "simulate_s": median_seconds(lambda: simulate_times(problem, orders), repeats),
                "validate_s": median_seconds(lambda: validate(problem, timed), repeats),
                "metrics_s": median_seconds(lambda: compute_metrics(problem, timed), repeats),
                "makespan": compute_metrics(problem, timed).makespan,
            }
        )
    return rows


def print_table(rows: list[dict], repeats: int) -> None:
    table = Table(title=f"simulate and validate, median of {repeats} runs (target: simulate < {TARGET_SECONDS:g} s)")
    for column in ("family", "timing", "p", "m", "ops", "simulate s", "validate s", "metrics s", "makespan"):
        table.add_column(column, justify="left" if column in ("family", "timing") else "right")
    for row in rows:
        table.add_row(
            row["family"],
            row["timing"],
            str(row["devices"]),
            str(row["microbatches"]),
            str(row["ops"]),
            f"{row['simulate_s']:.3f}",
            f"{row['validate_s']:.3f}",
            f"{row['metrics_s']:.3f}",
            f"{row['makespan']:.6g}",
        )
    Console(highlight=False, width=120).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS / "simulate.json")
    args = parser.parse_args()
    rows = run(args.devices, args.microbatches, args.repeats)
    print_table(rows, args.repeats)
    worst = max(row["simulate_s"] for row in rows)
    print(f"slowest simulate: {worst:.3f} s ({'meets' if worst < TARGET_SECONDS else 'misses'} the {TARGET_SECONDS:g} s target)")
    write_json_atomic(
        args.output,
        {"machine": platform.platform(), "python": platform.python_version(), "repeats": args.repeats, "rows": rows},
    )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    run_main(main)
