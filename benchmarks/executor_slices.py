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
  ranks' contention for the CPU (the load average is printed). So the sliced ops are
  profiled too (the busy time of every slice's F and BW in the seq1f1b run, and of its B
  and W in a seq1f1b-zb run, also a row): the last columns time each schedule's order on
  that sliced profile.

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
    record: tuple[str, ...] = ()  # schedules whose ops' busy times are recorded (the sliced profile)
    timeout_s: float = 300.0

    def execute(self, rank, world_size, device, position=None):
        import torch.distributed as dist

        from optimizer.formats.schedule_json import schedule_from_json
        from runtime.session import open_session

        times: dict[str, list[float]] = {}
        busy: dict[tuple[str, int, int], list[float]] = {}
        for name, data in self.schedules.items():
            schedule = schedule_from_json(data, name, check=False)
            session = open_session(
                schedule,
                self.model,
                rank,
                world_size,
                device,
                self.timeout_s,
                source=name,
                model_problem=schedule.problem,
                position=position,
            )
            seconds = []
            for step in range(self.warmup + self.steps):
                result = session.step(step, record=name in self.record)
                session.update()
                if step >= self.warmup:
                    seconds.append(result.seconds)
                    for timing in result.timings:
                        busy.setdefault((timing.op.kind, timing.op.stage, timing.op.slice), []).append(timing.busy * 1e3)
            times[name] = seconds
        gathered = [None] * world_size
        dist.all_gather_object(gathered, (times, busy))
        return gathered if rank == 0 else None


def sliced_profile(problem, busy: dict[tuple[str, int, int], list[float]]):
    """The sliced problem with the times its ops took: per stage, F, B, W and the fused BW
    as the sums over slices of each slice op's median busy time, and the slices' F/B cost
    shares from the same medians (summed over stages: the problem has one cost per
    slice). So each slice's fixed cost, which the attention model leaves out, is in the
    prediction."""
    from optimizer.io import validate_model
    from optimizer.problem import Problem

    k_range = range(problem.num_slices)
    median = {key: statistics.median(values) for key, values in busy.items()}
    data = problem.model_dump(mode="json")
    for s, stage in enumerate(data["stages"]):
        stage["forward"] = sum(median[("F", s, k)] for k in k_range)
        stage["backward_input"] = max(sum(median[("B", s, k)] for k in k_range), 1e-4)
        stage["backward_weight"] = sum(median[("W", s, k)] for k in k_range)
        stage["backward"] = sum(median[("BW", s, k)] for k in k_range)
    per_slice = [sum(median[(kind, s, k)] for kind in ("F", "B") for s in range(problem.num_stages)) for k in k_range]
    for piece, cost in zip(data["slices"], per_slice, strict=True):
        piece["cost"] = cost / sum(per_slice)
    return validate_model(Problem, data, "sliced profile")


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
    parser.add_argument("--solve-seconds", type=float, default=20.0, help="time limit of the `auto` schedule (0: skip it)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    p, k = args.devices, args.slices
    stem = args.model.split(":")[0]
    output = args.output or ROOT / "benchmarks" / "results" / f"executor-slices-{stem}-p{p}-k{k}.json"

    from optimizer.exact import SolveOptions, solve
    from optimizer.io import write_json_atomic
    from optimizer.schedules import generate
    from optimizer.simulate import simulate
    from optimizer.slicing import slice_model, with_slices
    from runtime.launch import launch

    load_at_start = os.getloadavg()
    whole = whole_problem(args)
    length, hidden = cost_model(args)
    cut = slice_model(length, k, lengths="dp", cost="attention", hidden=hidden, stages=p)
    sliced = with_slices(whole, cut)
    schedules = {"1f1b (unsliced)": generate(whole, "1f1b")}
    schedules.update({family: generate(sliced, family) for family in ("terapipe", "seq1f1b")})
    if args.solve_seconds > 0:
        schedules["auto"] = solve(sliced, "auto", SolveOptions(time_limit=args.solve_seconds, threads=1))
    # A real model's sliced ops are also profiled: seq1f1b runs every slice's F and BW,
    # seq1f1b-zb its B and W.
    profiled = not args.model.startswith("synthetic")
    if profiled:
        schedules["seq1f1b-zb"] = generate(sliced, "seq1f1b-zb")
    started = time.perf_counter()
    job = SlicedRunJob(
        {n: s.to_json() for n, s in schedules.items()}, args.model, args.warmup, args.steps, ("seq1f1b", "seq1f1b-zb") if profiled else ()
    )
    gathered = launch(job, p, "gloo", 1)
    print(f"ran in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    busy: dict[tuple[str, int, int], list[float]] = {}
    for _, rank_busy in gathered:
        for key, values in rank_busy.items():
            busy.setdefault(key, []).extend(values)
    remeasured = sliced_profile(sliced, busy) if profiled else None

    rows = []
    for name, schedule in schedules.items():
        measured = statistics.median(max(rank[name][i] for rank, _ in gathered) for i in range(args.steps)) * 1e3
        row = {
            "schedule": name,
            "slices": schedule.problem.num_slices,
            "predicted_ms": schedule.makespan,
            "measured_ms": measured,
            "error": (measured - schedule.makespan) / schedule.makespan,
        }
        if remeasured is not None and schedule.problem.num_slices > 1:
            # The same order timed on the sliced profile.
            again = simulate(remeasured, schedule.order(), name).makespan
            row.update({"predicted_sliced_profile_ms": again, "error_sliced_profile": (measured - again) / again})
        rows.append(row)
    print(f"\n{p} ranks x 1 thread, gloo, one sequence, model {args.model}; slices {', '.join(map(str, cut.lengths))} of {length} tokens")
    print(f"(attention costs, h = {hidden}); median of {args.steps} steps after {args.warmup} warm-up\n")
    print("| schedule | slices | predicted ms | measured ms | error | predicted, sliced profile | error |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        retimed = f"{r['predicted_sliced_profile_ms']:.1f} | {r['error_sliced_profile']:+.1%}" if "error_sliced_profile" in r else "- | -"
        print(f"| {r['schedule']} | {r['slices']} | {r['predicted_ms']:.1f} | {r['measured_ms']:.1f} | {r['error']:+.1%} | {retimed} |")
    base = rows[0]
    auto = next((r for r in rows if r["schedule"] == "auto"), None)  # None with --solve-seconds 0
    if auto is not None:
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
    result = {"setup": setup, "rows": rows, "problem": sliced.model_dump(mode="json")}
    if remeasured is not None:
        result["sliced_profile"] = remeasured.model_dump(mode="json")
    write_json_atomic(output, result)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
