"""Executor benchmark: measured step time vs the simulator's prediction vs torch.distributed.pipelining.

For each placement the schedule families need (linear, interleaved:2, vshape), it
profiles the example model on the same ranks (`pipesched profile`) and builds each
family's schedule from it (on the linear placement also the optimizer's `auto` schedule,
solved from that profile); then runs, in one process group and one step of each in
turn, every schedule with our executor, the same model and split under
torch.distributed.pipelining's corresponding schedule, and the profiler's orders. The
prediction is the simulator's makespan of the schedule's order on the problem profiled
alongside the runs (BW ops timed with the profiled fused backward, as they run), so a
burst of load elsewhere on the machine hits measurement and prediction alike. A step's time is from the ranks leaving a barrier to the last rank ending
its ops (sends done); the optimizer update is outside it on both sides. Last, how much
of the gain over 1f1b that the simulator predicts for `auto` the run realizes.

    python benchmarks/executor.py                     # 2 ranks x 1 thread on CPU (gloo)
    python benchmarks/executor.py --backend nccl --devices 8

Prints a table and writes benchmarks/results/executor.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
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
PLACEMENT_FAMILIES = {
    "linear": ["gpipe", "1f1b", "zb-h1", "zb-h2"],
    "interleaved:2": ["interleaved-1f1b"],
    "vshape": ["zb-v", "v-half", "v-min", "dualpipe-v"],
}


@dataclass(frozen=True)
class BenchJob:
    """On every rank: each schedule with our executor and with its torch peer, and the
    profiling orders, one step of each in turn, so that a burst of load elsewhere on the
    machine hits every measurement alike (the prediction included)."""

    schedules: dict  # family -> schedule JSON
    model: str
    devices: int
    microbatches: int
    placement: str
    rounds: int
    warmup: int
    timeout_s: float = 120.0

    def execute(self, rank, world_size, device):
        import torch.distributed as dist

        from optimizer.schedule import schedule_from_json
        from runtime.profile import ping_pong, profiling_schedule, timed_steps
        from runtime.session import open_session

        def session(schedule):
            return open_session(schedule, self.model, rank, world_size, device, self.timeout_s)

        profiling = {
            fused: session(profiling_schedule(self.devices, self.microbatches, self.placement, fused=fused)) for fused in (False, True)
        }
        runs = {}
        for family, schedule_json in self.schedules.items():
            ours = session(schedule_from_json(schedule_json, family, check=False))
            peer = _TorchPeer(TORCH_PEERS[family], self.model, ours.plan, device) if family in TORCH_PEERS else None
            runs[family] = (ours, peer)

        busy: dict = {}
        times: dict[str, dict[str, list[float]]] = {family: {"ours": [], "torch": []} for family in runs}
        for step in range(self.warmup + self.rounds):
            measured = step >= self.warmup
            for profile_session in profiling.values():
                for key, values in timed_steps(profile_session, 1, step).items():
                    if measured:
                        busy.setdefault(key, []).extend(values)
            for family, (ours, peer) in runs.items():
                result = ours.step(step)
                ours.update()
                seconds = peer.step(step) if peer is not None else None
                if measured:
                    times[family]["ours"].append(result.seconds)
                    if seconds is not None:
                        times[family]["torch"].append(seconds)
        profile: tuple = (
            {key: statistics.median(values) * 1e3 for key, values in busy.items()},
            {},
            ping_pong(profiling[False], device),
        )
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--model", default="example:layers=8,hidden=128,heads=4,vocab=512,seq_len=64,batch_size=4")
    parser.add_argument("--steps", type=int, default=25, help="measured steps of each run (after 3 warm-up steps)")
    parser.add_argument("--solve-seconds", type=float, default=10.0, help="time limit of the `auto` schedule (0: skip it)")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "executor.json")
    args = parser.parse_args()

    from runtime.forkserver import rank_context

    rank_context()  # the rank server imports torch while we do

    from optimizer.exact import SolveOptions, solve
    from optimizer.exact.canonical import split_fused
    from optimizer.io import write_json_atomic
    from optimizer.problem import Problem
    from optimizer.schedules import GENERATORS, generate
    from optimizer.simulate import simulate
    from runtime.launch import launch
    from runtime.profile import ProfileJob, profile_result, with_fused_backward

    load_at_start = os.getloadavg()
    rows = []
    for placement, families in PLACEMENT_FAMILIES.items():
        families = [f for f in families if f in GENERATORS]
        # A short profile gives the orders (some families look at the times); the
        # prediction uses the profile measured alongside the runs.
        started = time.perf_counter()
        quick = ProfileJob(args.model, args.devices, args.microbatches, placement, steps=3, timeout_s=120)
        problem = Problem.model_validate(launch(quick, args.devices, args.backend, args.threads)["problem"])
        print(f"profiled {placement} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        schedules = {}
        for family in families:
            reason = GENERATORS[family].unsupported(problem)
            if reason is None:
                schedules[family] = generate(problem, family)
            else:
                print(f"skip {family}: {reason}", file=sys.stderr)
        if placement == "linear" and args.solve_seconds > 0:
            # 1f1b with each fused backward run as B then W: the same ops as `auto`, so
            # the two differ only in their order (the split's own cost is the same).
            schedules[SPLIT_1F1B] = simulate(problem, split_fused(schedules["1f1b"].order()), method=SPLIT_1F1B)
            schedules["auto"] = solve(problem, "auto", SolveOptions(time_limit=args.solve_seconds))
        job = BenchJob(
            {f: s.to_json() for f, s in schedules.items()},
            args.model,
            args.devices,
            args.microbatches,
            placement,
            args.steps,
            warmup=3,
        )
        started = time.perf_counter()
        gathered = launch(job, args.devices, args.backend, args.threads)
        print(f"ran {placement} schedules in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        profiled = profile_result(args.devices, args.microbatches, placement, [profile for _, profile in gathered])
        problem = Problem.model_validate(profiled["problem"])
        fused_problem = with_fused_backward(problem, profiled["fused_backward_ms"])
        for family, schedule in schedules.items():
            ours = _median_ms([times[family]["ours"] for times, _ in gathered])
            peer = _median_ms([times[family]["torch"] for times, _ in gathered])
            assert ours is not None, "every schedule ran on our executor"
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
                    "torch_class": TORCH_PEERS.get(family),
                    "torch_ms": peer,
                    "ours_over_torch": ours / peer if peer else None,
                    "steps": args.steps,
                    "profile": profiled,
                }
            )
            print(f"{family}: ours {ours:.1f} ms, predicted {predicted:.1f} ms, torch {peer or float('nan'):.1f} ms", file=sys.stderr)

    print_table(rows, args)
    gain = solved_gain(rows)
    if gain:
        print()
        print_gain(gain)
    print(f"\nload average (1 min) at start {load_at_start[0]:.2f}, at end {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    overhead = split_overhead(args.model, args.devices, args.microbatches, "cuda" if args.backend == "nccl" else "cpu", args.threads)
    print_overhead(overhead)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    setup = {
        "backend": args.backend,
        "devices": args.devices,
        "threads_per_rank": args.threads,
        "microbatches": args.microbatches,
        "model": args.model,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": __import__("torch").__version__,
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "step_time": "median over steps of the slowest rank, barrier to last op and sends done; optimizer update excluded",
    }
    write_json_atomic(args.output, {"setup": setup, "rows": rows, "split_backward": overhead, "solved_gain": gain})
    print(f"wrote {args.output}")


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


def print_table(rows: list[dict], args) -> None:
    print(
        f"\n{args.devices} ranks x {args.threads} thread(s), {args.backend}, {args.microbatches} microbatches, "
        f"model {args.model}; median of {args.steps} steps\n"
    )
    header = "| schedule | measured ms | predicted ms | error | torch.distributed.pipelining | torch ms | ours / torch |"
    print(header)
    print("|---|---:|---:|---:|---|---:|---:|")
    for r in rows:
        torch_ms = f"{r['torch_ms']:.1f}" if r["torch_ms"] else "-"
        ratio = f"{r['ours_over_torch']:.3f}" if r["ours_over_torch"] else "-"
        print(
            f"| {r['schedule']} | {r['measured_ms']:.1f} | {r['predicted_ms']:.1f} | {r['predicted_error']:+.1%} "
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
