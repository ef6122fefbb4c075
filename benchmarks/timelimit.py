"""Time-limit benchmark: how far past `--time-limit` each solver method returns, by size.

A time limit is a promise for every accepted size. For each case (Zero Bubble timings,
linear and V placements, memory at 1F1B's level, from p = 4, m = 16 up to p = 32, m = 256,
and p = 8, m = 130)
and each method, `solve` runs with the given limit and the wall-clock time of the whole
call is measured: overrun = elapsed - limit. The table is printed and saved to
benchmarks/results/timelimit.json. The promise the README states is the largest overrun
measured here, rounded up.

    python benchmarks/timelimit.py [--time-limit 2] [--methods auto,cpsat] [--only TEXT] [--output PATH]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from benchmarks.saving import selected
from benchmarks.script import run_main
from optimizer.exact import SolveOptions, solve
from optimizer.exact.api import WHOLE_MODEL_MAX_OPS, whole_model_refusal
from optimizer.io import write_json_atomic
from optimizer.problem import uniform_problem

RESULTS = Path(__file__).resolve().parent / "results"
# p = 8, m = 130 is CP-SAT's largest accepted size with the most ops per device (3,120
# ops, 390 a device): its memory constraints are the dearest to expand.
SIZES = ((4, 16), (8, 32), (8, 130), (16, 64), (32, 128), (32, 256))


def cases():
    for p, m in SIZES:
        yield f"p{p}-m{m}-linear", uniform_problem(p, m, 1.0, 1.0, 0.6, comm_time=0.03, mem_backward_input=-0.63, memory_limit=p)
        yield (
            f"p{p}-m{m}-vshape",
            uniform_problem(
                p, m, 0.5, 0.5, 0.3, comm_time=0.03, placement="vshape", mem_forward=0.5, mem_backward_input=-0.315, memory_limit=p / 2
            ),
        )
    # Below V-Min's memory, where nothing the families build in time fits but `paced` (the
    # list scheduler's fallback ran 5 s past a 1 s limit here): 256 devices, 49k ops.
    yield "p256-m32-vshape-limit3", uniform_problem(256, 32, placement="vshape", memory_limit=3.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=2.0, help="Solver time limit per case (s).")
    parser.add_argument("--methods", default="auto,cpsat", help="Comma-separated methods.")
    parser.add_argument("--only", default="", help="Run only the cases whose name contains one of these comma-separated texts.")
    parser.add_argument("--output", type=Path, default=RESULTS / "timelimit.json")
    args = parser.parse_args()
    rows = []
    for name, problem in cases():
        if not selected(name, args.only):
            continue
        for method in args.methods.split(","):
            if whole_model_refusal(problem, method) is not None:
                # Refused up front (the size contract): nothing to time.
                print(f"{name:20s} {method:6s} {problem.num_ops:6d} ops  refused (over {WHOLE_MODEL_MAX_OPS[method]} ops)", flush=True)
                continue
            began = time.monotonic()
            schedule = solve(problem, method, SolveOptions(time_limit=args.time_limit, threads=2))
            elapsed = time.monotonic() - began
            ops = sum(len(ops) for ops in schedule.devices)
            rows.append({"case": name, "method": method, "ops": ops, "elapsed": elapsed, "overrun": elapsed - args.time_limit})
            print(f"{name:20s} {method:6s} {ops:6d} ops  {elapsed:6.2f} s  overrun {elapsed - args.time_limit:+.2f} s", flush=True)
    table = Table(title=f"solve --time-limit {args.time_limit:g}: wall-clock time of the whole call")
    for column in ("case", "method", "ops", "elapsed (s)", "overrun (s)"):
        table.add_column(column, justify="left" if column in ("case", "method") else "right")
    for row in rows:
        table.add_row(row["case"], row["method"], str(row["ops"]), f"{row['elapsed']:.2f}", f"{row['overrun']:+.2f}")
    Console().print(table)
    worst = max(row["overrun"] for row in rows)
    print(f"largest overrun: {worst:+.2f} s")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        args.output,
        {"machine": platform.platform(), "time_limit": args.time_limit, "rows": rows, "largest_overrun": worst},
    )


if __name__ == "__main__":
    run_main(main)
