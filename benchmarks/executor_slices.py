"""The executor on token-sliced schedules: one long sequence, predicted against measured.

One sequence per step, p devices, K slices cut by TeraPipe's dynamic program under
attention costs. Schedules: unsliced 1F1B (the same problem with one slice), and on the
sliced problem terapipe, seq1f1b and the optimizer's `auto`. Each runs on our executor
(warm-up steps, then the median of the slowest rank's step time) and is set against the
simulator's makespan.

Two models:

- `synthetic` (default): the problem is a uniform one (`--base-ms` per stage's F and B of
  the whole sequence, W 0.75x) and the model sleeps each slice's op times, so 8 ranks fit
  on two cores: the gap to the prediction is the executor's own cost per op.
- `example[:options]`: the problem is *profiled* on the example GPT (whole sequences,
  then cut into slices by the attention cost model with the model's hidden size and
  sequence length), and the example GPT runs the schedules: the gap also holds what the
  cost model misses (per-slice fixed costs) and, with more ranks than cores, the
  ranks' contention for the CPU (the load average is printed).

    python benchmarks/executor_slices.py --devices 8 --slices 8     # synthetic:width=64 (64 columns to cut)
    python benchmarks/executor_slices.py --devices 8 --slices 8 --model example:layers=8,hidden=64,heads=4,seq_len=512,batch_size=1

Prints a table and writes benchmarks/results/executor-slices-{model}-p{p}-k{K}.json.
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
class SlicedRunJob:
    schedules: dict  # name -> schedule JSON
    model: str
    warmup: int
    steps: int
    timeout_s: float = 300.0

    def execute(self, rank, world_size, device):
        import torch.distributed as dist

        from optimizer.formats.schedule_json import schedule_from_json
        from runtime.session import open_session

        times: dict[str, list[float]] = {}
        for name, data in self.schedules.items():
            schedule = schedule_from_json(data, name, check=False)
            session = open_session(
                schedule, self.model, rank, world_size, device, self.timeout_s, source=name, model_problem=schedule.problem
            )
            seconds = []
            for step in range(self.warmup + self.steps):
                result = session.step(step)
                session.update()
                if step >= self.warmup:
                    seconds.append(result.seconds)
            times[name] = seconds
        gathered = [None] * world_size
        dist.all_gather_object(gathered, times)
        return gathered if rank == 0 else None


def whole_problem(args):
    """The unsliced problem of one sequence: uniform (synthetic) or profiled (example)."""
    from optimizer.io import validate_model
    from optimizer.problem import Problem, uniform_problem
    from runtime.launch import launch
    from runtime.profile import ProfileJob

    p = args.devices
    if args.model.startswith("synthetic"):
        return uniform_problem(p, 1, args.base_ms, args.base_ms, 0.75 * args.base_ms)
    profiled = launch(ProfileJob(args.model, p, 2, steps=3, timeout_s=300), p, "gloo", 1)
    data = {**profiled["problem"], "num_microbatches": 1}
    return validate_model(Problem, data, "profile")


def cost_model(args) -> tuple[int, int]:
    """Sequence length and hidden size the slices' attention costs are computed with."""
    if args.model.startswith("synthetic"):
        return args.sequence_length, args.hidden
    from runtime.models import example_config

    config = example_config(args.model)
    return config.seq_len, config.hidden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--slices", type=int, default=8)
    parser.add_argument("--model", default="synthetic:width=64", help="synthetic[:options] or example[:options]")
    parser.add_argument("--base-ms", type=float, default=80.0, help="synthetic: F and B of one stage for the whole sequence, ms")
    parser.add_argument("--sequence-length", type=int, default=32768, help="synthetic: tokens of the cost model")
    parser.add_argument("--hidden", type=int, default=4096, help="synthetic: hidden size of the cost model")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--solve-seconds", type=float, default=20.0)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    p, k = args.devices, args.slices
    stem = args.model.split(":")[0]
    output = args.output or ROOT / "benchmarks" / "results" / f"executor-slices-{stem}-p{p}-k{k}.json"

    from optimizer.exact import SolveOptions, solve
    from optimizer.io import write_json_atomic
    from optimizer.schedules import generate
    from optimizer.slicing import slice_model, with_slices
    from runtime.launch import launch

    load_at_start = os.getloadavg()
    whole = whole_problem(args)
    length, hidden = cost_model(args)
    cut = slice_model(length, k, lengths="dp", cost="attention", hidden=hidden, stages=p)
    sliced = with_slices(whole, cut)
    schedules = {"1f1b (unsliced)": generate(whole, "1f1b")}
    schedules.update({family: generate(sliced, family) for family in ("terapipe", "seq1f1b")})
    schedules["auto"] = solve(sliced, "auto", SolveOptions(time_limit=args.solve_seconds, threads=1))
    started = time.perf_counter()
    gathered = launch(SlicedRunJob({n: s.to_json() for n, s in schedules.items()}, args.model, args.warmup, args.steps), p, "gloo", 1)
    print(f"ran in {time.perf_counter() - started:.1f} s", file=sys.stderr)

    rows = []
    for name, schedule in schedules.items():
        measured = statistics.median(max(rank[name][i] for rank in gathered) for i in range(args.steps)) * 1e3
        rows.append(
            {
                "schedule": name,
                "slices": schedule.problem.num_slices,
                "predicted_ms": schedule.makespan,
                "measured_ms": measured,
                "error": (measured - schedule.makespan) / schedule.makespan,
            }
        )
    print(f"\n{p} ranks x 1 thread, gloo, one sequence, model {args.model}; slices {', '.join(map(str, cut.lengths))} of {length} tokens")
    print(f"(attention costs, h = {hidden}); median of {args.steps} steps after {args.warmup} warm-up\n")
    print("| schedule | slices | predicted ms | measured ms | error |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['schedule']} | {r['slices']} | {r['predicted_ms']:.1f} | {r['measured_ms']:.1f} | {r['error']:+.1%} |")
    base = rows[0]
    auto = rows[-1]
    print(
        f"\nauto against unsliced 1F1B: predicted {base['predicted_ms'] / auto['predicted_ms']:.2f}x shorter, "
        f"measured {base['measured_ms'] / auto['measured_ms']:.2f}x"
    )
    load_at_end = os.getloadavg()
    print(f"load average (1 min) at start {load_at_start[0]:.2f}, at end {load_at_end[0]:.2f} on {os.cpu_count()} cores")
    setup = {
        "devices": p,
        "slices": k,
        "model": args.model,
        "slice_lengths": list(cut.lengths),
        "sequence_length": length,
        "hidden": hidden,
        "base_ms": args.base_ms if stem == "synthetic" else None,
        "steps": args.steps,
        "warmup": args.warmup,
        "solve_seconds": args.solve_seconds,
        "cpu_count": os.cpu_count(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": load_at_end,
        "step_time": "median over steps of the slowest rank, barrier to last op and sends done; optimizer update excluded",
    }
    write_json_atomic(output, {"setup": setup, "rows": rows, "problem": sliced.model_dump(mode="json")})
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
