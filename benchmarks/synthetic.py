"""Executor at pipeline depth: the synthetic model on 8 or 16 ranks, both engines.

The synthetic model (runtime/synthetic.py) sleeps each op's time from the problem, in
ms, so 8-16 ranks fit on two cores and the measured step time can be set against the
simulator's prediction for the same problem: the gap is the executor's own cost (and
the machine's). The problem is heterogeneous (first stage x1.3, last x1.8) and
memory-tight (a limit halfway between V-Min's peak and p activations, so 1F1B and ZB-H1
exceed it and the optimizer has to work). Schedules: 1f1b, zb-h1, the best family that
fits, and the optimizer's `auto`; each runs on our executor and on torch's runtime from
the same CSV, one step of each in turn (a burst of load elsewhere hits all alike).

    python benchmarks/synthetic.py --devices 8
    python benchmarks/synthetic.py --devices 16 --base-ms 20
    python benchmarks/synthetic.py --devices 4 --model example:layers=8,hidden=64   # engines only

With a real model (`--model example...`) the problem's times are not the model's, so only
the two engines are compared on identical orders (the predicted columns are left out).

Prints a table and writes benchmarks/results/synthetic-p{devices}.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class DepthJob:
    schedules: dict  # name -> schedule JSON
    warmup: int
    steps: int
    model: str = "synthetic"
    timeout_s: float = 300.0

    def execute(self, rank, world_size, device):
        import torch.distributed as dist

        from optimizer.formats.schedule_json import schedule_from_json
        from runtime.session import open_session
        from runtime.torch_engine import TorchSession

        sessions = {}
        for name, data in self.schedules.items():
            schedule = schedule_from_json(data, name, check=False)
            ours = open_session(schedule, self.model, rank, world_size, device, self.timeout_s, source=name, model_problem=schedule.problem)
            sessions[name] = (ours, TorchSession(schedule, self.model, rank, world_size, device, name))
        times: dict[str, dict[str, list[float]]] = {name: {"ours": [], "torch": []} for name in sessions}
        for step in range(self.warmup + self.steps):
            for name, (ours, theirs) in sessions.items():
                seconds = ours.step(step).seconds
                ours.update()
                torch_seconds, _ = theirs.step(step)
                theirs.update()
                if step >= self.warmup:
                    times[name]["ours"].append(seconds)
                    times[name]["torch"].append(torch_seconds)
        gathered = [None] * world_size
        dist.all_gather_object(gathered, times)
        return gathered if rank == 0 else None


def depth_problem(p: int, m: int, base_ms: float):
    """Heterogeneous, memory-tight: see the module docstring."""
    from optimizer.io import validate_model
    from optimizer.problem import Problem, uniform_problem

    v_min_peak = (p + 4) // 3
    limit = (v_min_peak + p) / 2
    data = uniform_problem(p, m, base_ms, base_ms, 0.75 * base_ms, mem_forward=1.0, mem_backward_input=-0.5, memory_limit=limit).model_dump(
        mode="json"
    )
    for s, stage in enumerate(data["stages"]):
        scale = 1.3 if s == 0 else 1.8 if s == p - 1 else 1.0
        for key in ("forward", "backward_input", "backward_weight"):
            stage[key] *= scale
    return validate_model(Problem, data, "problem")


def pick_schedules(problem, solve_seconds: float) -> dict:
    from optimizer.exact import SolveOptions, solve
    from optimizer.schedules import generate, generate_all

    schedules = {name: generate(problem, name) for name in ("1f1b", "zb-h1")}
    built, _ = generate_all(problem)
    fitting = [s for name, s in built.items() if s.fits_memory() and name not in schedules]
    best = min(fitting, key=lambda s: s.makespan)
    schedules[f"best family ({best.method})"] = best
    schedules["auto"] = solve(problem, "auto", SolveOptions(time_limit=solve_seconds, threads=1))
    return schedules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=None, help="default 2 x devices")
    parser.add_argument("--base-ms", type=float, default=20.0, help="F and B of a middle stage, ms (W is 0.75 x)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--solve-seconds", type=float, default=20.0)
    parser.add_argument("--model", default="synthetic", help="synthetic, or a real model to compare the engines only")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    p = args.devices
    m = args.microbatches or 2 * p
    synthetic = args.model == "synthetic" or args.model.startswith("synthetic:")
    stem = "synthetic" if synthetic else "engines-" + args.model.split(":")[0]
    output = args.output or ROOT / "benchmarks" / "results" / f"{stem}-p{p}.json"

    from optimizer.io import write_json_atomic
    from runtime.launch import launch

    problem = depth_problem(p, m, args.base_ms)
    schedules = pick_schedules(problem, args.solve_seconds)
    load_at_start = os.getloadavg()
    started = time.perf_counter()
    gathered = launch(DepthJob({n: s.to_json() for n, s in schedules.items()}, args.warmup, args.steps, args.model), p, "gloo", 1)
    print(f"ran in {time.perf_counter() - started:.1f} s", file=sys.stderr)

    rows = []
    for name, schedule in schedules.items():
        # a step's time is the slowest rank's; the median over steps
        ours = statistics.median(max(rank[name]["ours"][i] for rank in gathered) for i in range(args.steps)) * 1e3
        theirs = statistics.median(max(rank[name]["torch"][i] for rank in gathered) for i in range(args.steps)) * 1e3
        if not synthetic:  # the problem's times are not this model's: no prediction
            rows.append({"schedule": name, "measured_ms": ours, "torch_ms": theirs, "ours_over_torch": ours / theirs})
            continue
        rows.append(
            {
                "schedule": name,
                "fits_memory": schedule.fits_memory(),
                "peak_memory": max(schedule.metrics.peak_memory),
                "predicted_ms": schedule.makespan,
                "measured_ms": ours,
                "error": (ours - schedule.makespan) / schedule.makespan,
                "torch_ms": theirs,
                "torch_error": (theirs - schedule.makespan) / schedule.makespan,
                "ours_over_torch": ours / theirs,
            }
        )
    limit = problem.memory_limit
    model = f"synthetic model (base {args.base_ms:g} ms, first x1.3, last x1.8)" if synthetic else f"model {args.model}"
    print(f"\n{p} ranks x 1 thread, gloo, {m} microbatches, {model}, memory limit {limit:g}; median of {args.steps} steps\n")
    gain: dict | None = None
    if synthetic:
        gain = print_rows(rows)
    else:
        print_engines(rows)
    print(f"load average (1 min) at start {load_at_start[0]:.2f}, at end {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    setup = {
        "devices": p,
        "model": args.model,
        "microbatches": m,
        "base_ms": args.base_ms,
        "memory_limit": limit,
        "steps": args.steps,
        "warmup": args.warmup,
        "solve_seconds": args.solve_seconds,
        "cpu_count": os.cpu_count(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "step_time": "median over steps of the slowest rank, barrier to last op and sends done; optimizer update excluded",
    }
    write_json_atomic(output, {"setup": setup, "rows": rows, "auto_gain_over_1f1b": gain, "problem": problem.model_dump(mode="json")})
    print(f"wrote {output}")


def print_rows(rows: list[dict]) -> dict:
    """The synthetic table, and auto's realized share of its predicted gain over 1f1b."""
    print("| schedule | fits | predicted ms | ours ms | error | torch runtime ms | error | ours / torch |")
    print("|---|:-:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['schedule']} | {'yes' if r['fits_memory'] else 'no'} | {r['predicted_ms']:.1f} | {r['measured_ms']:.1f} | {r['error']:+.1%} "
            f"| {r['torch_ms']:.1f} | {r['torch_error']:+.1%} | {r['ours_over_torch']:.3f} |"
        )
    by_name = {r["schedule"]: r for r in rows}
    predicted_gain = by_name["1f1b"]["predicted_ms"] - by_name["auto"]["predicted_ms"]
    measured_gain = by_name["1f1b"]["measured_ms"] - by_name["auto"]["measured_ms"]
    share = measured_gain / predicted_gain if predicted_gain > 0 else None
    shown = f"{share:.0%}" if share is not None else "n/a"
    print(f"\nauto against 1f1b: gain predicted {predicted_gain:+.1f} ms, measured {measured_gain:+.1f} ms, realized {shown}")
    return {"predicted_ms": predicted_gain, "measured_ms": measured_gain, "realized_share": share}


def print_engines(rows: list[dict]) -> None:
    """A real model: the two engines on identical orders only."""
    print("| schedule | ours ms | torch runtime ms | ours / torch |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['schedule']} | {r['measured_ms']:.1f} | {r['torch_ms']:.1f} | {r['ours_over_torch']:.3f} |")
    return None


if __name__ == "__main__":
    main()
