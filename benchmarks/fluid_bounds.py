"""How far `auto`'s published-suite schedules are from optimal, by the fluid bound.

For the Zero Bubble settings on the V placement (benchmarks/published.py) at V-Min's,
V-Half's and p's memory, this takes `auto`'s span and lower bound at 60 s from
benchmarks/results/published-60s.json and runs the time-indexed fluid relaxation
(optimizer.exact.fluidbound) between them, for `--seconds` per case. The fluid bound
keeps every device at once; its answer is a proof that no schedule is shorter than it
(the span objective, the first op at 0), whatever time `auto` was given.

Columns: `auto`'s span at 60 s, the bound `auto` reported and its gap, the fluid bound
and the gap it leaves, its grid step (ms; default, as `--certify`: the span over
fluidbound.default_samples, 1000 at p = 8 on the V placement; every `--coarse`-th step
between the ramps) and seconds.

    python benchmarks/fluid_bounds.py [--seconds 300] [--only TEXT] [--step MS] [--coarse N] [--output PATH]

Results: benchmarks/results/fluid_bounds.json and fluid_bounds.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.published import published_problem, setting_named
from benchmarks.saving import save_results
from benchmarks.script import run_main
from optimizer.exact.fluidbound import COARSE, default_samples, fluid_bound

RESULTS = Path(__file__).resolve().parent / "results"
SOURCE = RESULTS / "published-60s.json"
LEVELS = ("vmin", "vhalf", "p")


def known_cases(source: Path, only: str) -> list[dict]:
    """The V cases of the published suite at LEVELS, with `auto`'s longest run."""
    rows = json.loads(source.read_text())["results"]
    return [row for row in rows if row["placement"] == "vshape" and row["level"] in LEVELS and only in row["case"]]


def measure(row: dict, seconds: float, step: float | None, coarse: int) -> dict:
    auto = row["auto"][-1]
    setting = setting_named(f"{row['model']}-p{row['p']}-m{row['m']}")
    problem = published_problem(setting, row["memory_limit"], "vshape")
    started = time.monotonic()
    if step is None:  # as --certify: the default samples over the span
        samples = default_samples(problem.num_stages)
        value = fluid_bound(problem, auto["lower_bound"], auto["span"], time_limit=seconds, samples=samples, coarse=coarse)
    else:
        value = fluid_bound(problem, auto["lower_bound"], auto["span"], time_limit=seconds, step=step, coarse=coarse)
    return {
        "case": row["case"],
        "span": auto["span"],
        "auto_bound": auto["lower_bound"],
        "auto_gap": 1 - auto["lower_bound"] / auto["span"],
        "fluid_bound": value,
        "fluid_gap": 1 - value / auto["span"],
        "step": step,  # None: the span / fluidbound.default_samples
        "coarse": coarse,
        "seconds": round(time.monotonic() - started, 1),
    }


def _step(step: float | None) -> str:
    return f"{step:g}" if step else "default"


def table(rows: list[dict], seconds: float) -> str:
    lines = [
        f"Fluid bound (optimizer.exact.fluidbound) with up to {seconds:g} s per case, HiGHS (interior point), 2 threads, on "
        f"{platform.machine()} ({platform.processor() or 'cpu'}). Span and `auto`'s bound: `auto` at 60 s "
        "(published-60s.json), objective the longest device span.",
        "",
        "| case | auto span | auto's bound | gap | fluid bound | gap | grid step (ms) | s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['span']:.1f} | {r['auto_bound']:.1f} | {100 * r['auto_gap']:.2f}% | "
            f"{r['fluid_bound']:.1f} | {100 * r['fluid_gap']:.2f}% | {_step(r['step'])} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=300.0, help="time per case (default 300)")
    parser.add_argument("--only", default="", help="only cases whose name contains this text")
    parser.add_argument(
        "--step", type=float, default=None, help="grid step in ms (default: the tested span over fluidbound.default_samples)"
    )
    parser.add_argument("--coarse", type=int, default=COARSE, help=f"keep every N-th step between the ramps (default {COARSE}; 1: uniform)")
    parser.add_argument("--source", type=Path, default=SOURCE, help="the published suite's results to bound")
    parser.add_argument("--output", type=Path, default=RESULTS / "fluid_bounds.json")
    args = parser.parse_args()
    if args.seconds <= 0:
        parser.error("--seconds: must be positive")
    if args.coarse < 1:
        parser.error("--coarse: must be at least 1")
    rows = []
    for row in known_cases(args.source, args.only):
        result = measure(row, args.seconds, args.step, args.coarse)
        rows.append(result)
        print(
            f"{result['case']}: span {result['span']:.1f}, bound {result['auto_bound']:.1f} -> {result['fluid_bound']:.1f}"
            f" (gap {100 * result['auto_gap']:.2f}% -> {100 * result['fluid_gap']:.2f}%) in {result['seconds']:.0f} s",
            flush=True,
        )
        payload = {"seconds": args.seconds, "step": args.step, "coarse": args.coarse, "only": args.only, "results": rows}
        save_results(args.output, payload, table(rows, args.seconds))
    if not rows:
        print(f"no case matches {args.only!r}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run_main(main)
