"""`auto` against the schedules torch runs for torchtitan users, each at its own memory.

For each of the Zero Bubble paper's 12 profiled settings (benchmarks/published.py) and
each of torch.distributed.pipelining's built-in schedules, on the placement it takes
(ScheduleGPipe and Schedule1F1B: linear; ScheduleLoopedBFS, ScheduleInterleaved1F1B and
ScheduleInterleavedZeroBubble: interleaved:2, the paper's stages split into 2p half-size
chunks; ScheduleZBVZeroBubble and ScheduleDualPipeV: vshape, the same chunks as a V),
this builds torch's own order
(runtime/torch_orders.py), times it on the problem, and sets the memory limit to the
largest peak it reaches on any device. `auto` then solves that problem (iteration time,
the makespan, which is what torch users wait for) at each time limit. torch 2.13's
Schedule1F1B builds an order that names a microbatch that does not exist (its runtime
runs a loop of its own, see the README); renumbered it is our `1f1b`, which stands in for
it (column "order": ours).

Columns: torch's makespan, auto's makespan at each limit and its ratio to torch's (below
1: shorter), auto's lower bound and gap at the longest limit, and what won.

    python benchmarks/builtins.py [--time-limits 5] [--only TEXT] [--output PATH]

Results: benchmarks/results/builtins.json and builtins.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.published import SETTINGS, published_problem
from benchmarks.saving import cores, save_results
from benchmarks.script import run_main, seconds_list
from optimizer.errors import PipeschedError
from optimizer.exact import SolveOptions, solve
from optimizer.schedules import generate
from runtime.torch_orders import BUILTIN, builtin_schedule, row_name

RESULTS = Path(__file__).resolve().parent / "results"
# The placement each built-in is measured on (see the module doc).
PLACEMENT = {"single": "linear", "loop": "interleaved:2", "v": "vshape"}
# Our family with torch's order, for a built-in whose own order our validator refuses.
STAND_IN = {"Schedule1F1B": "1f1b"}


def run_case(setting, class_name: str, time_limits: list[float], seed: int) -> dict:
    placement = PLACEMENT[BUILTIN[class_name]]
    row: dict = {"setting": setting.name, "torch": row_name(class_name), "placement": placement}
    unlimited = published_problem(setting, None, placement)
    try:
        theirs, row["order"] = builtin_schedule(unlimited, class_name), "torch's"
    except PipeschedError as error:
        if class_name not in STAND_IN:
            return {**row, "refused": str(error)}
        theirs, row["order"] = generate(unlimited, STAND_IN[class_name]), f"ours ({STAND_IN[class_name]})"
        row["torch_refused"] = str(error)
    limit = max(theirs.metrics.peak_memory)
    problem = published_problem(setting, limit, placement)
    runs = []
    for seconds in time_limits:
        began = time.monotonic()
        schedule = solve(problem, "auto", SolveOptions(time_limit=seconds, seed=seed, threads=2))
        runs.append(
            {
                "time_limit": seconds,
                "makespan": schedule.makespan,
                "ratio": schedule.makespan / theirs.makespan,
                "lower_bound": schedule.metrics.lower_bound,
                "gap": schedule.metrics.gap,
                "method_won": schedule.metrics.method_won,
                "peak_memory": max(schedule.metrics.peak_memory),
                "seconds": round(time.monotonic() - began, 2),
            }
        )
    return {**row, "memory_limit": limit, "torch_makespan": theirs.makespan, "auto": runs}


def markdown(results: list[dict], time_limits: list[float], machine: str) -> str:
    limits = " / ".join(f"{t:g} s" for t in time_limits)
    lines = [
        f"`auto` (makespan objective, {limits}, 2 workers, on {machine}) against torch's built-in schedules, "
        "each at the largest peak memory torch's own order reaches (limit, in microbatch activations of a linear stage). "
        "Ratio: auto / torch (below 1 is shorter). Bound and gap from the longest run.",
        "",
        "| setting | torch | order | placement | limit | torch ms | "
        + " | ".join(f"auto {t:g} s (ratio)" for t in time_limits)
        + " | lower bound | gap | won by |",
        "|---|---|---|---|---:|---:|" + "---:|" * len(time_limits) + "---:|---:|---|",
    ]
    for r in results:
        if "refused" in r:
            lines.append(
                f"| {r['setting']} | {r['torch']} | - | {r['placement']} | - | - |"
                + " - |" * len(time_limits)
                + f" - | - | {r['refused']} |"
            )
            continue
        cells = " | ".join(f"{run['makespan']:.1f} ({run['ratio']:.4f})" for run in r["auto"])
        last = r["auto"][-1]
        gap = "-" if last["gap"] is None else f"{last['gap']:.2%}"
        bound = "-" if last["lower_bound"] is None else f"{last['lower_bound']:.1f}"
        lines.append(
            f"| {r['setting']} | {r['torch']} | {r['order']} | {r['placement']} | {r['memory_limit']:g} | {r['torch_makespan']:.1f} | {cells} | {bound} | {gap} | {last['method_won']} |"
        )
    measured = [r for r in results if "auto" in r]
    for i, seconds in enumerate(time_limits):
        worse = sum(1 for r in measured if r["auto"][i]["ratio"] > 1 + 1e-9)
        shorter = sum(1 for r in measured if r["auto"][i]["ratio"] < 1 - 1e-9)
        lines.append("")
        lines.append(f"At {seconds:g} s: auto longer than torch's in {worse} of {len(measured)} cases, strictly shorter in {shorter}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limits", type=seconds_list, default="5", help="comma-separated seconds for each auto run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="run only cases whose setting or torch name contains this text")
    parser.add_argument("--output", type=Path, default=RESULTS / "builtins.json")
    args = parser.parse_args(argv)
    time_limits = args.time_limits
    machine = f"{platform.machine()} ({cores()} cores)"
    results = []
    for setting in SETTINGS:
        for class_name in BUILTIN:
            if args.only and args.only not in setting.name and args.only not in row_name(class_name):
                continue
            result = run_case(setting, class_name, time_limits, args.seed)
            results.append(result)
            if "refused" in result:
                print(f"{setting.name:18s} {row_name(class_name):28s} refused: {result['refused']}", flush=True)
            else:
                runs = "  ".join(f"{run['time_limit']:g}s {run['makespan']:.1f} ({run['ratio']:.4f})" for run in result["auto"])
                print(f"{setting.name:18s} {row_name(class_name):28s} torch {result['torch_makespan']:.1f}  auto {runs}", flush=True)
    table = markdown(results, time_limits, machine)
    print(table)
    payload = {"machine": machine, "platform": platform.platform(), "time_limits": time_limits, "seed": args.seed, "results": results}
    save_results(args.output, payload, table)
    return 0


if __name__ == "__main__":
    run_main(main)
