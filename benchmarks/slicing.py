"""Slice-length benchmark: how long TeraPipe's dynamic program takes, and how even it cuts.

For sequences of L tokens under the attention cost rule (optimizer/slicing.py, hidden
size h) and K slices on a p-stage pipeline, it measures the median time of
`slice_model(..., lengths="dp")` over `--repeats` runs and reports the slices it chose:
the longest and shortest in tokens and the largest slice cost against the mean (1.0:
perfectly balanced), beside the same for even lengths. The target is under 1 s for every
case (what `pipesched problem --slice-lengths dp` may take). Prints a table and writes
benchmarks/results/slicing.json.

    python benchmarks/slicing.py [--stages 8] [--hidden 4096] [--repeats 3]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from benchmarks.script import run_main
from optimizer.io import write_json_atomic
from optimizer.slicing import slice_model

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_SECONDS = 1.0
LENGTHS = (4096, 32768, 131072)
SLICES = (2, 4, 8, 16)


def run(stages: int, hidden: int, repeats: int) -> list[dict]:
    rows = []
    for length in LENGTHS:
        for k in SLICES:
            times = []
            for _ in range(repeats):
                began = time.perf_counter()
                dp = slice_model(length, k, lengths="dp", cost="attention", hidden=hidden, stages=stages)
                times.append(time.perf_counter() - began)
            even = slice_model(length, k, lengths="even", cost="attention", hidden=hidden, stages=stages)
            rows.append(
                {
                    "tokens": length,
                    "slices": k,
                    "dp_seconds": statistics.median(times),
                    "dp_lengths": list(dp.lengths),
                    "dp_max_cost_over_mean": max(dp.costs) * k,
                    "even_max_cost_over_mean": max(even.costs) * k,
                }
            )
    return rows


def print_table(rows: list[dict], stages: int, hidden: int, repeats: int) -> None:
    title = f"TeraPipe DP, attention costs (h = {hidden}), p = {stages}, median of {repeats} (target < {TARGET_SECONDS:g} s)"
    table = Table(title=title)
    for column in ("tokens", "K", "dp s", "longest", "shortest", "dp max/mean cost", "even max/mean cost"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["tokens"]),
            str(row["slices"]),
            f"{row['dp_seconds']:.3f}",
            str(max(row["dp_lengths"])),
            str(min(row["dp_lengths"])),
            f"{row['dp_max_cost_over_mean']:.3f}",
            f"{row['even_max_cost_over_mean']:.3f}",
        )
    Console(highlight=False, width=120).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS / "slicing.json")
    args = parser.parse_args()
    rows = run(args.stages, args.hidden, args.repeats)
    print_table(rows, args.stages, args.hidden, args.repeats)
    worst = max(row["dp_seconds"] for row in rows)
    print(f"slowest DP: {worst:.3f} s ({'meets' if worst < TARGET_SECONDS else 'misses'} the {TARGET_SECONDS:g} s target)")
    setup = {"stages": args.stages, "hidden": args.hidden, "repeats": args.repeats}
    write_json_atomic(args.output, {"machine": platform.platform(), "python": platform.python_version(), **setup, "rows": rows})
    print(f"wrote {args.output}")


if __name__ == "__main__":
    run_main(main)
