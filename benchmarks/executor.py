"""Executor benchmark: measured step time vs the simulator's prediction vs torch's runtime.

Two modes, one script.

A real model (the default, `--model example:...`). For each placement the schedule
families need (linear, interleaved:2, vshape), it profiles the model on the same ranks
(`pipesched profile`) and builds each family's schedule from it (on the linear placement
also the optimizer's `auto` schedule, solved from that profile); then runs, in one
process group and one step of each in turn, every schedule with our executor, with
torch's runtime on the same order (`--engine torch`: the schedule's CSV in
`_PipelineScheduleRuntime`), the same model and split under torch.distributed.pipelining's
corresponding built-in schedule, and the profiler's orders. The prediction is the
simulator's makespan of the schedule's order on the problem profiled alongside the runs
(BW ops timed with the profiled fused backward, as they run), so a burst of load
elsewhere on the machine hits measurement and prediction alike.

The synthetic model (`--model synthetic`, runtime/synthetic.py) at pipeline depth. Each
op sleeps its time from the problem, in ms, so 8-16 ranks fit on two cores and the
measured step time can be set against the simulator's prediction for the same problem:
the gap is the executor's own cost (and the machine's). The problem is heterogeneous
(first stage x1.3, last x1.8) and memory-tight (a limit halfway between V-Min's peak and
p activations, so 1F1B and ZB-H1 exceed it and the optimizer has to work). Schedules:
1f1b, zb-h1, the best family that fits, and the optimizer's `auto`; each runs on our
executor and on torch's runtime from the same CSV, one step of each in turn.

In both, a step's time is from the ranks leaving a barrier to the last rank ending its
ops (sends done), the median over steps of the slowest rank; the optimizer update is
outside it on both sides. Last, how much of the gain over 1f1b that the simulator
predicts for `auto` the run realizes.

    python benchmarks/executor.py                          # example model, 2 ranks x 1 thread (gloo)
    python benchmarks/executor.py --devices 4 --placements linear
    python benchmarks/executor.py --backend nccl --devices 8
    python benchmarks/executor.py --model synthetic --devices 8
    python benchmarks/executor.py --model synthetic --devices 16

Prints a table and writes benchmarks/results/executor.json (a real model on 2 ranks),
executor-p{devices}.json (on more) or executor-synthetic-p{devices}.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# Our family -> the torch.distributed.pipelining class it is compared with.
TORCH_PEERS = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "zb-h1": "ScheduleInterleavedZeroBubble",  # one stage per rank
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "zb-v": "ScheduleZBVZeroBubble",
    "dualpipe-v": "ScheduleDualPipeV",
}
SPLIT_1F1B = "1f1b, split B/W"
# Per schedule and step: our executor, torch's runtime on the same order, torch's built-in
# peer (step seconds), and the CPU seconds of the first two.
ENGINE_KEYS = ("ours", "csv", "peer", "ours cpu", "csv cpu")
EXAMPLE = "example:layers=8,hidden=128,heads=4,vocab=512,seq_len=64,batch_size=4"
PLACEMENT_FAMILIES = {
    "linear": ["gpipe", "1f1b", "zb-h1", "zb-h2"],
    "interleaved:2": ["interleaved-1f1b"],
    "vshape": ["zb-v", "v-half", "v-min", "dualpipe-v"],
}


@dataclass(frozen=True)
class BenchJob:
    """On every rank: each schedule with our executor, with torch's runtime on the same
    order (its CSV), with its torch built-in peer (`peers`), and the profiling orders
    (`profile`: devices, microbatches, placement), one step of each in turn, so that a
    burst of load elsewhere on the machine hits every measurement alike (the prediction
    included)."""

    schedules: dict  # name -> schedule JSON
    model: str
    rounds: int
    warmup: int
    profile: tuple[int, int, str] | None = None
    peers: bool = True
    timeout_s: float = 300.0

    def execute(self, rank, world_size, device, position=None):
        import torch.distributed as dist

        from optimizer.formats.schedule_json import schedule_from_json
        from runtime.profile import ping_pong, profiling_schedule, timed_steps
        from runtime.session import open_session
        from runtime.torch_engine import TorchSession

        def session(schedule, name):
            return open_session(
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

        profiling = {}
        if self.profile is not None:
            devices, microbatches, placement = self.profile
            for fused in (False, True):
                profiling[fused] = session(profiling_schedule(devices, microbatches, placement, fused=fused), "profile")
        runs = {}
        for name, schedule_json in self.schedules.items():
            schedule = schedule_from_json(schedule_json, name, check=False)
            ours = session(schedule, name)
            same_order = TorchSession(schedule, self.model, rank, world_size, device, name)
            peer = _TorchPeer(TORCH_PEERS[name], self.model, ours.plan, device) if self.peers and name in TORCH_PEERS else None
            runs[name] = (ours, same_order, peer)

        busy: dict = {}
        times: dict[str, dict[str, list[float]]] = {name: {engine: [] for engine in ENGINE_KEYS} for name in runs}
        for step in range(self.warmup + self.rounds):
            measured = step >= self.warmup
            for profile_session in profiling.values():
                for key, values in timed_steps(profile_session, 1, step).items():
                    if measured:
                        busy.setdefault(key, []).extend(values)
            for name, (ours, same_order, peer) in runs.items():
                # CPU seconds of the whole rank process (gloo's threads too): unlike the
                # step time, hardly changed by other jobs sharing the cores.
                cpu = time.process_time()
                seconds = {"ours": ours.step(step).seconds, "ours cpu": time.process_time() - cpu}
                ours.update()
                cpu = time.process_time()
                seconds["csv"], _ = same_order.step(step)
                seconds["csv cpu"] = time.process_time() - cpu
                same_order.update()
                if peer is not None:
                    seconds["peer"] = peer.step(step)
                if measured:
                    for engine, value in seconds.items():
                        times[name][engine].append(value)
        profile = None
        if profiling:
            profile = ({key: statistics.median(values) * 1e3 for key, values in busy.items()}, {}, ping_pong(profiling[False], device))
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, (times, profile))
        return gathered if rank == 0 else None


class _TorchPeer:
    """The same stages, data and loss under a torch.distributed.pipelining schedule."""

    def __init__(self, class_name, model_name, plan, device):
        import torch
        from torch.distributed import pipelining

        from runtime.models import load_model

        self.model = load_model(model_name, plan.num_stages)
        self.plan = plan
        self.device = device
        stages = [pipelining.PipelineStage(self.model.stages[s].to(device), s, plan.num_stages, device) for s in plan.stages]
        schedule_class = getattr(pipelining.schedules, class_name)
        single = class_name in ("ScheduleGPipe", "Schedule1F1B")
        self.schedule = schedule_class(stages[0] if single else stages, plan.num_microbatches, loss_fn=self.model.loss_fn)
        params = [p for s in plan.stages for p in self.model.stages[s].parameters()]
        self.optimizer = torch.optim.AdamW(params, lr=1e-3)
        self.params = params

    def step(self, step):
        import torch.distributed as dist

        inputs, targets = self.model.make_batch(step, self.plan.num_microbatches)
        args = (inputs.to(self.device),) if 0 in self.plan.stages else ()
        target = targets.to(self.device) if self.plan.num_stages - 1 in self.plan.stages else None
        dist.barrier()
        start = time.perf_counter()
        self.schedule.step(*args, target=target, losses=[], return_outputs=False)
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        self.optimizer.step()
        for p in self.params:
            p.grad = None
        return seconds


def split_overhead(model_name: str, num_stages: int, microbatches: int, device_name: str, threads: int, repeats: int = 30) -> list[dict]:
    """Per stage, in this process (with the ranks' thread count): the fused backward (BW) against our
    split (B, then W from the recorded frontier) and against the naive split (B with
    the graph retained, W as a second autograd pass to the parameters)."""
    import torch

    device = torch.device(device_name)

    def now() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    from runtime.backward import SplitBackward, backward_fused, backward_weight
    from runtime.models import load_model
    from runtime.session import output_specs

    torch.set_num_threads(threads)
    model = load_model(model_name, num_stages)
    inputs, targets = model.make_batch(0, microbatches)
    x0, target = inputs.chunk(microbatches)[0], targets.chunk(microbatches)[0]
    specs = output_specs(model.stages, x0)
    x0, target = x0.to(device), target.to(device)
    rows = []
    for s, stage in enumerate(model.stages):
        stage.to(device)
        last = s == num_stages - 1
        split = SplitBackward(list(stage.parameters()))
        grad = None if last else torch.randn(specs[s].shape, device=device)

        def forward():
            x = x0 if s == 0 else torch.randn(specs[s - 1].shape, device=device).requires_grad_()
            out = stage(x)
            return x, (model.loss_fn(out, target) if last else out)

        def fused(x, out):
            backward_fused(out, grad, [x])

        def ours(x, out):
            start = now()
            _, work = split.backward_input(out, grad, [x])
            middle = now()
            backward_weight(work)
            return middle - start, now() - middle

        def naive(x, out):
            start = now()
            if x.requires_grad:
                torch.autograd.grad(out, [x], grad, retain_graph=True)
            middle = now()
            torch.autograd.grad(out, split.params, grad)
            return middle - start, now() - middle

        samples: dict[str, list[float]] = {"fused": [], "B": [], "W": [], "naive B": [], "naive W": []}
        for repeat in range(repeats + 3):
            for name, fn in (("fused", fused), ("ours", ours), ("naive", naive)):
                x, out = forward()
                start = now()
                parts = fn(x, out)
                total = now() - start
                stage.zero_grad(set_to_none=True)
                if repeat < 3:
                    continue
                if name == "fused":
                    samples["fused"].append(total)
                else:
                    prefix = "" if name == "ours" else "naive "
                    samples[prefix + "B"].append(parts[0])
                    samples[prefix + "W"].append(parts[1])
        ms = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
        rows.append(
            {
                "stage": s,
                "fused_ms": ms["fused"],
                "split_b_ms": ms["B"],
                "split_w_ms": ms["W"],
                "split_overhead": (ms["B"] + ms["W"]) / ms["fused"] - 1,
                "naive_b_ms": ms["naive B"],
                "naive_w_ms": ms["naive W"],
                "naive_overhead": (ms["naive B"] + ms["naive W"]) / ms["fused"] - 1,
            }
        )
    return rows


def _median_ms(per_rank: list[list[float]]) -> float | None:
    """Median over steps of the slowest rank's time."""
    if not per_rank or not per_rank[0]:
        return None
    return statistics.median(max(rank[i] for rank in per_rank) for i in range(len(per_rank[0]))) * 1e3


def _engine_ms(gathered: Iterable, name: str, engine: str) -> float | None:
    """`gathered`: every rank's (times, profile) from BenchJob."""
    return _median_ms([times[name][engine] for times, _ in gathered])


def _cpu_ms(gathered: Iterable, name: str, engine: str) -> float:
    """Median over steps of the CPU time all ranks spent in the step."""
    per_rank = [times[name][engine] for times, _ in gathered]
    return statistics.median(sum(rank[i] for rank in per_rank) for i in range(len(per_rank[0]))) * 1e3


def is_synthetic(model: str) -> bool:
    return model == "synthetic" or model.startswith("synthetic:")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=None, help="default 8 (a real model), 2 x devices (synthetic)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--model", default=EXAMPLE, help="a real model (default: the example model), or synthetic[:options]")
    parser.add_argument("--steps", type=int, default=None, help="measured steps of each run, after the warm-up (default 25; synthetic 5)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 3; synthetic 1)")
    parser.add_argument(
        "--solve-seconds", type=float, default=None, help="time limit of the `auto` schedule (default 10; synthetic 20; 0: skip it)"
    )
    parser.add_argument("--placements", default=",".join(PLACEMENT_FAMILIES), help="real model: placements to run, comma-separated")
    parser.add_argument("--base-ms", type=float, default=20.0, help="synthetic: F and B of a middle stage, ms (W is 0.75 x)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()

    from runtime.forkserver import rank_context

    rank_context()  # the rank server imports torch while we do
    load_at_start = os.getloadavg()
    if is_synthetic(args.model):
        result = run_synthetic(args)
        default_output = ROOT / "benchmarks" / "results" / f"executor-synthetic-p{args.devices}.json"
    else:
        result = run_profiled(args)
        name = "executor.json" if args.devices == 2 else f"executor-p{args.devices}.json"
        default_output = ROOT / "benchmarks" / "results" / name
    print(f"\nload average (1 min) at start {load_at_start[0]:.2f}, at end {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")

    from optimizer.io import write_json_atomic

    result["setup"].update(
        {
            "backend": args.backend,
            "devices": args.devices,
            "threads_per_rank": args.threads,
            "model": args.model,
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "torch": __import__("torch").__version__,
            "load_average_at_start": load_at_start,
            "load_average_at_end": os.getloadavg(),
            "step_time": "median over steps of the slowest rank, barrier to last op and sends done; optimizer update excluded",
        }
    )
    output = args.output or default_output
    output.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(output, result)
    print(f"wrote {output}")


def run_profiled(args) -> dict:
    """A real model: profile, build every family, run on both engines and torch's peers."""
    from optimizer.exact import SolveOptions, solve
    from optimizer.exact.canonical import split_fused
    from optimizer.problem import Problem
    from optimizer.schedules import GENERATORS, generate
    from optimizer.simulate import simulate
    from runtime.launch import launch
    from runtime.profile import ProfileJob, profile_result, with_fused_backward

    microbatches = args.microbatches or 8
    steps = 25 if args.steps is None else args.steps
    warmup = 3 if args.warmup is None else args.warmup
    solve_seconds = 10.0 if args.solve_seconds is None else args.solve_seconds
    rows = []
    for placement in args.placements.split(","):
        if placement not in PLACEMENT_FAMILIES:
            raise SystemExit(f"error: --placements: '{placement}' is not one of {', '.join(PLACEMENT_FAMILIES)}")
        families = [f for f in PLACEMENT_FAMILIES[placement] if f in GENERATORS]
        # A short profile gives the orders (some families look at the times); the
        # prediction uses the profile measured alongside the runs.
        started = time.perf_counter()
        quick = ProfileJob(args.model, args.devices, microbatches, placement, steps=3, timeout_s=120)
        problem = Problem.model_validate(launch(quick, args.devices, args.backend, args.threads)["problem"])
        print(f"profiled {placement} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        schedules = {}
        for family in families:
            reason = GENERATORS[family].unsupported(problem)
            if reason is None:
                schedules[family] = generate(problem, family)
            else:
                print(f"skip {family}: {reason}", file=sys.stderr)
        if placement == "linear" and solve_seconds > 0:
            # 1f1b with each fused backward run as B then W: the same ops as `auto`, so
            # the two differ only in their order (the split's own cost is the same).
            schedules[SPLIT_1F1B] = simulate(problem, split_fused(schedules["1f1b"].order()), method=SPLIT_1F1B)
            schedules["auto"] = solve(problem, "auto", SolveOptions(time_limit=solve_seconds))
        job = BenchJob(
            {f: s.to_json() for f, s in schedules.items()}, args.model, steps, warmup, profile=(args.devices, microbatches, placement)
        )
        started = time.perf_counter()
        gathered = launch(job, args.devices, args.backend, args.threads)
        print(f"ran {placement} schedules in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        profiled = profile_result(args.devices, microbatches, placement, [profile for _, profile in gathered])
        problem = Problem.model_validate(profiled["problem"])
        fused_problem = with_fused_backward(problem, profiled["fused_backward_ms"])
        for family, schedule in schedules.items():
            ours = _engine_ms(gathered, family, "ours")
            same_order = _engine_ms(gathered, family, "csv")
            peer = _engine_ms(gathered, family, "peer")
            assert ours is not None and same_order is not None, "every schedule ran on both engines"
            # A BW op runs the fused backward, cheaper than B + W: time it as measured.
            fused = any(op.kind == "BW" for device in schedule.devices for op in device)
            predicted = simulate(fused_problem if fused else problem, schedule.order()).makespan
            rows.append(
                {
                    "schedule": family,
                    "placement": placement,
                    "measured_ms": ours,
                    "predicted_ms": predicted,
                    "predicted_error": (predicted - ours) / ours,
                    "predicted_ms_with_split_times": simulate(problem, schedule.order()).makespan,
                    "torch_runtime_ms": same_order,
                    "ours_over_torch_runtime": ours / same_order,
                    "cpu_ms_ours": _cpu_ms(gathered, family, "ours cpu"),
                    "cpu_ms_torch_runtime": _cpu_ms(gathered, family, "csv cpu"),
                    "torch_class": TORCH_PEERS.get(family),
                    "torch_ms": peer,
                    "ours_over_torch": ours / peer if peer else None,
                    "steps": steps,
                    "profile": profiled,
                }
            )
            print(f"{family}: ours {ours:.1f} ms, predicted {predicted:.1f} ms, torch runtime {same_order:.1f} ms", file=sys.stderr)

    print(
        f"\n{args.devices} ranks x {args.threads} thread(s), {args.backend}, {microbatches} microbatches, "
        f"model {args.model}; median of {steps} steps\n"
    )
    print_table(rows)
    gain = solved_gain(rows)
    if gain:
        print()
        print_gain(gain)
    overhead = split_overhead(args.model, args.devices, microbatches, "cuda" if args.backend == "nccl" else "cpu", args.threads)
    print_overhead(overhead)
    setup = {"microbatches": microbatches, "steps": steps, "warmup": warmup, "solve_seconds": solve_seconds}
    return {"setup": setup, "rows": rows, "split_backward": overhead, "solved_gain": gain}


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


def depth_schedules(problem, solve_seconds: float) -> dict:
    """1f1b, zb-h1, the fastest other family that fits the limit, and `auto`."""
    from optimizer.exact import SolveOptions, solve
    from optimizer.schedules import generate, generate_all

    schedules = {name: generate(problem, name) for name in ("1f1b", "zb-h1")}
    built, _ = generate_all(problem)
    fitting = [s for name, s in built.items() if s.fits_memory() and name not in schedules]
    best = min(fitting, key=lambda s: s.makespan)
    schedules[f"best family ({best.method})"] = best
    if solve_seconds > 0:  # 0: skip it (--solve-seconds)
        schedules["auto"] = solve(problem, "auto", SolveOptions(time_limit=solve_seconds, threads=1))
    return schedules


def run_synthetic(args) -> dict:
    """The synthetic model at depth: both engines against the prediction."""
    from runtime.launch import launch

    p = args.devices
    m = args.microbatches or 2 * p
    steps = 5 if args.steps is None else args.steps
    warmup = 1 if args.warmup is None else args.warmup
    solve_seconds = 20.0 if args.solve_seconds is None else args.solve_seconds
    problem = depth_problem(p, m, args.base_ms)
    schedules = depth_schedules(problem, solve_seconds)
    started = time.perf_counter()
    job = BenchJob({n: s.to_json() for n, s in schedules.items()}, args.model, steps, warmup, peers=False)
    gathered = launch(job, p, args.backend, args.threads)
    print(f"ran in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    rows = []
    for name, schedule in schedules.items():
        ours, theirs = _engine_ms(gathered, name, "ours"), _engine_ms(gathered, name, "csv")
        assert ours is not None and theirs is not None, "every schedule ran on both engines"
        rows.append(
            {
                "schedule": name,
                "fits_memory": schedule.fits_memory(),
                "peak_memory": max(schedule.metrics.peak_memory),
                "predicted_ms": schedule.makespan,
                "measured_ms": ours,
                "error": (ours - schedule.makespan) / schedule.makespan,
                "torch_runtime_ms": theirs,
                "torch_runtime_error": (theirs - schedule.makespan) / schedule.makespan,
                "ours_over_torch_runtime": ours / theirs,
                "cpu_ms_ours": _cpu_ms(gathered, name, "ours cpu"),
                "cpu_ms_torch_runtime": _cpu_ms(gathered, name, "csv cpu"),
            }
        )
    print(
        f"\n{p} ranks x {args.threads} thread, {args.backend}, {m} microbatches, synthetic model (base {args.base_ms:g} ms, "
        f"first x1.3, last x1.8), memory limit {problem.memory_limit:g}; median of {steps} steps\n"
    )
    gain = print_synthetic(rows)
    setup = {"microbatches": m, "base_ms": args.base_ms, "memory_limit": problem.memory_limit, "steps": steps, "warmup": warmup}
    setup["solve_seconds"] = solve_seconds
    return {"setup": setup, "rows": rows, "auto_gain_over_1f1b": gain, "problem": problem.model_dump(mode="json")}


def print_synthetic(rows: list[dict]) -> dict:
    """The synthetic table, and auto's realized share of its predicted gain over 1f1b."""
    print("| schedule | fits | predicted ms | ours ms | error | torch runtime ms | error | ours / torch | CPU ours / torch |")
    print("|---|:-:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['schedule']} | {'yes' if r['fits_memory'] else 'no'} | {r['predicted_ms']:.1f} | {r['measured_ms']:.1f} | {r['error']:+.1%} "
            f"| {r['torch_runtime_ms']:.1f} | {r['torch_runtime_error']:+.1%} | {r['ours_over_torch_runtime']:.3f} "
            f"| {r['cpu_ms_ours'] / r['cpu_ms_torch_runtime']:.3f} |"
        )
    by_name = {r["schedule"]: r for r in rows}
    if "auto" not in by_name:  # --solve-seconds 0
        return {"predicted_ms": None, "measured_ms": None, "realized_share": None}
    predicted_gain = by_name["1f1b"]["predicted_ms"] - by_name["auto"]["predicted_ms"]
    measured_gain = by_name["1f1b"]["measured_ms"] - by_name["auto"]["measured_ms"]
    share = measured_gain / predicted_gain if predicted_gain > 0 else None
    shown = f"{share:.0%}" if share is not None else "n/a"
    print(f"\nauto against 1f1b: gain predicted {predicted_gain:+.1f} ms, measured {measured_gain:+.1f} ms, realized {shown}")
    return {"predicted_ms": predicted_gain, "measured_ms": measured_gain, "realized_share": share}


def solved_gain(rows: list[dict]) -> dict | None:
    """How much of the gain over 1f1b that the simulator predicts for `auto` shows up when run.

    Against 1f1b with its backward split (same ops, other order: the scheduling gain) and
    against 1f1b as it runs, fused (what a user gets, the split's cost included).
    """
    by_name = {r["schedule"]: r for r in rows if r["placement"] == "linear"}
    if "auto" not in by_name:
        return None
    gains = {}
    for baseline in (SPLIT_1F1B, "1f1b"):
        if baseline not in by_name:
            continue
        predicted = by_name[baseline]["predicted_ms"] - by_name["auto"]["predicted_ms"]
        measured = by_name[baseline]["measured_ms"] - by_name["auto"]["measured_ms"]
        gains[baseline] = {
            "predicted_ms": predicted,
            "measured_ms": measured,
            "realized_share": measured / predicted if predicted > 0 else None,
        }
    return gains


def print_gain(gains: dict) -> None:
    for baseline, gain in gains.items():
        share = f"{gain['realized_share']:.0%}" if gain["realized_share"] is not None else "n/a (no predicted gain)"
        print(
            f"auto against {baseline}: gain predicted {gain['predicted_ms']:+.1f} ms, measured {gain['measured_ms']:+.1f} ms; "
            f"realized share of the predicted gain: {share}"
        )


def print_table(rows: list[dict]) -> None:
    header = (
        "| schedule | measured ms | predicted ms | error | torch runtime, same order ms | ours / torch runtime | CPU ours / torch runtime "
        "| torch.distributed.pipelining | torch ms | ours / torch |"
    )
    print(header)
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        torch_ms = f"{r['torch_ms']:.1f}" if r["torch_ms"] else "-"
        ratio = f"{r['ours_over_torch']:.3f}" if r["ours_over_torch"] else "-"
        print(
            f"| {r['schedule']} | {r['measured_ms']:.1f} | {r['predicted_ms']:.1f} | {r['predicted_error']:+.1%} "
            f"| {r['torch_runtime_ms']:.1f} | {r['ours_over_torch_runtime']:.3f} | {r['cpu_ms_ours'] / r['cpu_ms_torch_runtime']:.3f} "
            f"| {r['torch_class'] or '-'} | {torch_ms} | {ratio} |"
        )


def print_overhead(rows: list[dict]) -> None:
    print("\nSplit backward cost, one microbatch, one process (median ms)\n")
    print("| stage | fused BW | B | W | B+W vs BW | naive B | naive W | naive vs BW |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['stage']} | {r['fused_ms']:.2f} | {r['split_b_ms']:.2f} | {r['split_w_ms']:.2f} | {r['split_overhead']:+.1%} "
            f"| {r['naive_b_ms']:.2f} | {r['naive_w_ms']:.2f} | {r['naive_overhead']:+.1%} |"
        )


if __name__ == "__main__":
    main()
