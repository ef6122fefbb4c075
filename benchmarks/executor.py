"""Executor benchmark: measured step time vs the simulator's prediction vs torch.distributed.pipelining.

For each placement the schedule families need (linear, interleaved:2, vshape), it
profiles the example model on the same ranks (`pipesched profile`), builds each
family's schedule from that profile (its makespan is the prediction; schedules with
fused BW ops are timed with the profiled fused backward, as they run), then runs, in
one process group, our executor and torch.distributed.pipelining's schedule with the
same stage modules, data and loss, alternating rounds of steps so background load hits
both alike. A step's time is from the ranks leaving a barrier to the last rank ending
its ops (sends done); the optimizer update is outside it on both sides.

    python benchmarks/executor.py                     # 2 ranks x 1 thread on CPU (gloo)
    python benchmarks/executor.py --backend nccl --devices 8

Prints a table and writes benchmarks/results/executor.json.
"""

from __future__ import annotations

import argparse
import json
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
PLACEMENT_FAMILIES = {
    "linear": ["gpipe", "1f1b", "zb-h1", "zb-h2"],
    "interleaved:2": ["interleaved-1f1b"],
    "vshape": ["zb-v", "v-half", "v-min", "dualpipe-v"],
}


@dataclass(frozen=True)
class BenchJob:
    """Runs, on every rank, each schedule with our executor and with its torch peer."""

    schedules: dict  # family -> schedule JSON
    model: str
    rounds: int
    steps_per_round: int
    warmup: int
    timeout_s: float = 120.0

    def execute(self, rank, world_size, device):
        import torch.distributed as dist

        results = {}
        for family, schedule_json in self.schedules.items():
            results[family] = self._bench(family, schedule_json, rank, world_size, device)
        gathered = [None] * world_size
        dist.all_gather_object(gathered, results)
        return gathered if rank == 0 else None

    def _bench(self, family, schedule_json, rank, world_size, device):
        from optimizer.schedule import schedule_from_json
        from runtime.session import open_session

        schedule = schedule_from_json(schedule_json, family, check=False)
        ours = open_session(schedule, self.model, rank, world_size, device, self.timeout_s)
        peer = _TorchPeer(TORCH_PEERS[family], self.model, ours.plan, device) if family in TORCH_PEERS else None
        times = {"ours": [], "torch": []}
        for round_ in range(self.rounds + 1):
            steps = self.warmup if round_ == 0 else self.steps_per_round
            for step in range(steps):
                result = ours.step(step)
                ours.update()
                if round_:
                    times["ours"].append(result.seconds)
            if peer is not None:
                for step in range(steps):
                    seconds = peer.step(step)
                    if round_:
                        times["torch"].append(seconds)
        return times


class _TorchPeer:
    """The same stages, data and loss under a torch.distributed.pipelining schedule."""

    def __init__(self, class_name, model_name, plan, device):
        import torch
        from torch.distributed import pipelining

        from runtime.models import load_model

        self.model = load_model(model_name, plan.num_stages)
        self.plan = plan
        self.device = device
        stages = [
            pipelining.PipelineStage(self.model.stages[s].to(device), s, plan.num_stages, device)
            for s in plan.stages
        ]
        schedule_class = getattr(pipelining.schedules, class_name)
        single = class_name in ("ScheduleGPipe", "Schedule1F1B")
        self.schedule = schedule_class(
            stages[0] if single else stages, plan.num_microbatches, loss_fn=self.model.loss_fn
        )
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


def split_overhead(model_name: str, num_stages: int, microbatches: int, repeats: int = 30) -> list[dict]:
    """Per stage, in this process with one thread: the fused backward (BW) against our
    split (B, then W from the recorded frontier) and against the naive split (B with
    the graph retained, W as a second autograd pass to the parameters)."""
    import torch

    from runtime.backward import SplitBackward, backward_fused, backward_weight
    from runtime.models import load_model
    from runtime.session import output_specs

    torch.set_num_threads(1)
    model = load_model(model_name, num_stages)
    inputs, targets = model.make_batch(0, microbatches)
    x0, target = inputs.chunk(microbatches)[0], targets.chunk(microbatches)[0]
    specs = output_specs(model.stages, x0)
    rows = []
    for s, stage in enumerate(model.stages):
        last = s == num_stages - 1
        split = SplitBackward(list(stage.parameters()))
        grad = None if last else torch.randn(specs[s].shape)

        def forward():
            x = x0 if s == 0 else torch.randn(specs[s - 1].shape).requires_grad_()
            out = stage(x)
            return x, (model.loss_fn(out, target) if last else out)

        def fused(x, out):
            backward_fused(out, grad, [x])

        def ours(x, out):
            start = time.perf_counter()
            _, work = split.backward_input(out, grad, [x])
            middle = time.perf_counter()
            backward_weight(work)
            return middle - start, time.perf_counter() - middle

        def naive(x, out):
            start = time.perf_counter()
            if x.requires_grad:
                torch.autograd.grad(out, [x], grad, retain_graph=True)
            middle = time.perf_counter()
            torch.autograd.grad(out, split.params, grad)
            return middle - start, time.perf_counter() - middle

        samples = {"fused": [], "B": [], "W": [], "naive B": [], "naive W": []}
        for repeat in range(repeats + 3):
            for name, fn in (("fused", fused), ("ours", ours), ("naive", naive)):
                x, out = forward()
                start = time.perf_counter()
                parts = fn(x, out)
                total = time.perf_counter() - start
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
    parser.add_argument(
        "--model", default="example:layers=8,hidden=128,heads=4,vocab=512,seq_len=64,batch_size=4"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=5)
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "executor.json")
    args = parser.parse_args()

    from runtime.forkserver import rank_context

    rank_context()  # the rank server imports torch while we do

    from optimizer.problem import Problem
    from optimizer.schedules import GENERATORS, generate
    from runtime.launch import launch
    from optimizer.simulate import simulate
    from runtime.profile import ProfileJob, with_fused_backward

    rows = []
    for placement, families in PLACEMENT_FAMILIES.items():
        families = [f for f in families if f in GENERATORS]
        profile_job = ProfileJob(
            args.model, args.devices, args.microbatches, placement, steps=args.profile_steps, timeout_s=120
        )
        started = time.perf_counter()
        profiled = launch(profile_job, args.devices, args.backend, args.threads)
        problem = Problem.model_validate(profiled["problem"])
        fused_problem = with_fused_backward(problem, profiled["fused_backward_ms"])
        print(f"profiled {placement} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        schedules = {}
        for family in families:
            reason = GENERATORS[family].unsupported(problem)
            if reason is None:
                schedules[family] = generate(problem, family)
            else:
                print(f"skip {family}: {reason}", file=sys.stderr)
        job = BenchJob(
            {f: s.to_json() for f, s in schedules.items()}, args.model, args.rounds, args.steps_per_round, warmup=3
        )
        started = time.perf_counter()
        gathered = launch(job, args.devices, args.backend, args.threads)
        print(f"ran {placement} schedules in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        for family, schedule in schedules.items():
            ours = _median_ms([rank[family]["ours"] for rank in gathered])
            peer = _median_ms([rank[family]["torch"] for rank in gathered])
            # A BW op runs the fused backward, cheaper than B + W: time it as measured.
            fused = any(op.kind == "BW" for device in schedule.devices for op in device)
            predicted = simulate(fused_problem, schedule.order()).makespan if fused else schedule.makespan
            rows.append(
                {
                    "schedule": family,
                    "placement": placement,
                    "measured_ms": ours,
                    "predicted_ms": predicted,
                    "predicted_error": (predicted - ours) / ours,
                    "predicted_ms_with_split_times": schedule.makespan,
                    "torch_class": TORCH_PEERS.get(family),
                    "torch_ms": peer,
                    "ours_over_torch": ours / peer if peer else None,
                    "steps": args.rounds * args.steps_per_round,
                }
            )
            print(f"{family}: ours {ours:.1f} ms, predicted {predicted:.1f} ms, torch {peer or float('nan'):.1f} ms", file=sys.stderr)

    print_table(rows, args)
    overhead = split_overhead(args.model, args.devices, args.microbatches)
    print_overhead(overhead)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    setup = {
        "backend": args.backend,
        "devices": args.devices,
        "threads_per_rank": args.threads,
        "microbatches": args.microbatches,
        "model": args.model,
        "cpu_count": __import__("os").cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": __import__("torch").__version__,
        "load_average_at_end": __import__("os").getloadavg(),
        "step_time": "median over steps of the slowest rank, barrier to last op and sends done; optimizer update excluded",
    }
    args.output.write_text(json.dumps({"setup": setup, "rows": rows, "split_backward": overhead}, indent=1) + "\n")
    print(f"wrote {args.output}")


def print_table(rows: list[dict], args) -> None:
    print(
        f"\n{args.devices} ranks x {args.threads} thread(s), {args.backend}, {args.microbatches} microbatches, "
        f"model {args.model}; median of {args.rounds * args.steps_per_round} steps\n"
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
    print("\nSplit backward cost, one microbatch, one thread (median ms)\n")
    print("| stage | fused BW | B | W | B+W vs BW | naive B | naive W | naive vs BW |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['stage']} | {r['fused_ms']:.2f} | {r['split_b_ms']:.2f} | {r['split_w_ms']:.2f} | {r['split_overhead']:+.1%} "
            f"| {r['naive_b_ms']:.2f} | {r['naive_w_ms']:.2f} | {r['naive_overhead']:+.1%} |"
        )


if __name__ == "__main__":
    main()
