"""Two suites of benchmarks/solver.py: token slices (`--suite slices`) and fused-or-split (`--suite fused`).

slices: p in {4, 8}, one, two or four sequences per iteration (microbatches), each cut
into K in {1, 2, 4, 8} token slices of a long sequence with attention-dominated costs
(65536 tokens, hidden size 2048: a token's attention work 4h*t reaches 5.3 times its
linear 24h^2 at the end; slice lengths from TeraPipe's dynamic program, so slices cost
about the same). Zero Bubble's stage shape (F = 1, B = 1, W = 0.6 for a whole sequence,
comm 0.03; memory F +1, B -0.63, W -0.37) and a memory limit of p sequences' activations
(1F1B's). Per case: makespan and peak memory of the unsliced gpipe and 1f1b (the same
problem with K = 1), of the sliced families (terapipe, seq1f1b, seq1f1b-zb), and of
`auto`, its lower bound and gap, and auto's speed-up over unsliced 1F1B.

fused: Zero Bubble's shape at (p, m) in {(4, 8), (8, 16), (8, 32)}, limit p, with B + W
costing 0, 10, 30 or 60 % more than the fused backward BW: `auto` against 1f1b (fused
backwards) and zb-h1 (split).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.saving import cores, save_results, selected
from optimizer.exact import SolveOptions, solve
from optimizer.exact.incumbents import generator_candidates
from optimizer.problem import Problem, uniform_problem
from optimizer.schedule import Schedule
from optimizer.schedules import get_generator
from optimizer.simulate import simulate
from optimizer.slicing import slice_model, with_slices

FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, COMM = 1.0, 1.0, 0.6, 0.03
MEM_FORWARD, MEM_BACKWARD_INPUT = 1.0, -0.63
SEQUENCE_LENGTH, HIDDEN = 65536, 2048
UNSLICED_FAMILIES = ("gpipe", "1f1b")
SLICED_FAMILIES = ("terapipe", "seq1f1b", "seq1f1b-zb")


def base_problem(p: int, m: int, backward: float | None = None) -> Problem:
    return uniform_problem(
        p,
        m,
        FORWARD,
        BACKWARD_INPUT,
        BACKWARD_WEIGHT,
        comm_time=COMM,
        mem_forward=MEM_FORWARD,
        mem_backward_input=MEM_BACKWARD_INPUT,
        memory_limit=float(p),
        backward=backward,
    )


@dataclass(frozen=True)
class SliceCase:
    p: int
    m: int  # sequences per iteration
    k: int  # slices per sequence

    @property
    def name(self) -> str:
        return f"p{self.p}-m{self.m}-K{self.k}"

    def problem(self) -> Problem:
        unsliced = base_problem(self.p, self.m)
        if self.k == 1:
            return unsliced
        model = slice_model(SEQUENCE_LENGTH, self.k, lengths="dp", cost="attention", hidden=HIDDEN, stages=self.p)
        return with_slices(unsliced, model)


def slice_cases() -> list[SliceCase]:
    return [SliceCase(p, m, k) for p in (4, 8) for m in (1, 2, 4) for k in (1, 2, 4, 8)]


def _row(schedule: Schedule) -> dict:
    return {"makespan": schedule.makespan, "peak_memory": max(schedule.metrics.peak_memory), "fits": schedule.fits_memory()}


def _auto_row(schedule: Schedule, seconds: float) -> dict:
    m = schedule.metrics
    return {
        "makespan": m.makespan,
        "peak_memory": max(m.peak_memory),
        "lower_bound": m.lower_bound,
        "gap": m.gap,
        "status": m.status,
        "method_won": m.method_won,
        "seconds": round(seconds, 2),
    }


def run_slice_case(case: SliceCase, time_limit: float, seed: int) -> dict:
    problem = case.problem()
    unsliced = base_problem(case.p, case.m)
    families = {name: _row(simulate(unsliced, get_generator(name).build(unsliced))) for name in UNSLICED_FAMILIES}
    if case.k > 1:
        candidates, _ = generator_candidates(problem)
        families.update({c.name: _row(c.schedule) for c in candidates if c.name in SLICED_FAMILIES})
    began = time.monotonic()
    schedule = solve(problem, "auto", SolveOptions(time_limit=time_limit, seed=seed, threads=2))
    auto = _auto_row(schedule, time.monotonic() - began)
    sliced_best = min((row["makespan"] for name, row in families.items() if name in SLICED_FAMILIES and row["fits"]), default=None)
    return {
        "case": case.name,
        "p": case.p,
        "sequences": case.m,
        "slices": case.k,
        "ops_per_device": 3 * case.m * case.k,
        "families": families,
        "auto": auto,
        "auto_not_worse_than_sliced_families": sliced_best is None or auto["makespan"] <= sliced_best * (1 + 1e-9),
        "speedup_over_unsliced_1f1b": families["1f1b"]["makespan"] / auto["makespan"],
    }


def slices_markdown(results: list[dict], time_limit: float) -> str:
    names = UNSLICED_FAMILIES + SLICED_FAMILIES
    lines = [
        f"`auto` at {time_limit:g} s per case, seed 0, 2 workers, on {platform.machine()} ({cores()} cores). "
        f"Attention-dominated slices of a {SEQUENCE_LENGTH}-token sequence (hidden {HIDDEN}), TeraPipe's slice lengths; "
        "memory limit p sequences' activations. Cells: makespan / peak memory (✗ over the limit); gpipe and 1f1b on the "
        "unsliced problem. Gap: (makespan - lower bound) / makespan. ×1F1B: unsliced 1F1B's makespan over auto's.",
        "",
        "| case | " + " | ".join(names) + " | auto | lower bound | gap | won by | ×1F1B | s |",
        "|---|" + "---:|" * len(names) + "---:|---:|---:|---|---:|---:|",
    ]
    for r in results:
        cells = []
        for name in names:
            row = r["families"].get(name)
            cells.append("-" if row is None else f"{row['makespan']:.2f} / {row['peak_memory']:.2f}{'' if row['fits'] else ' ✗'}")
        a = r["auto"]
        lines.append(
            f"| {r['case']} | " + " | ".join(cells) + f" | {a['makespan']:.2f} / {a['peak_memory']:.2f} | {a['lower_bound']:.2f} | "
            f"{a['gap']:.1%} | {a['method_won']} | {r['speedup_over_unsliced_1f1b']:.2f} | {a['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


# -- fused-or-split -------------------------------------------------------------------


@dataclass(frozen=True)
class FusedCase:
    p: int
    m: int
    extra: float  # B + W costs this much more than BW

    @property
    def name(self) -> str:
        return f"p{self.p}-m{self.m}-split+{self.extra:.0%}"

    def problem(self) -> Problem:
        return base_problem(self.p, self.m, backward=round((BACKWARD_INPUT + BACKWARD_WEIGHT) / (1 + self.extra), 6))


def fused_cases() -> list[FusedCase]:
    # m = 2p is within the whole model's reach (up to 600 ops); p = 8, m = 32 (768 ops)
    # is left to window search, which keeps the choice for the backwards it frees.
    shapes = [(4, 8), (8, 16), (8, 32)]
    return [FusedCase(p, m, extra) for p, m in shapes for extra in (0.0, 0.1, 0.3, 0.6)]


def run_fused_case(case: FusedCase, time_limit: float, seed: int) -> dict:
    problem = case.problem()
    families = {name: _row(simulate(problem, get_generator(name).build(problem))) for name in ("1f1b", "zb-h1")}
    began = time.monotonic()
    schedule = solve(problem, "auto", SolveOptions(time_limit=time_limit, seed=seed, threads=2))
    auto = _auto_row(schedule, time.monotonic() - began)
    auto["fused_backwards"] = sum(op.kind == "BW" for ops in schedule.devices for op in ops)
    auto["backwards"] = problem.num_stages * problem.num_microbatches
    better = min(row["makespan"] for row in families.values() if row["fits"])
    return {
        "case": case.name,
        "p": case.p,
        "m": case.m,
        "split_extra": case.extra,
        "fused_backward": problem.stages[0].backward,
        "families": families,
        "auto": auto,
        "auto_not_worse_than_better_family": auto["makespan"] <= better * (1 + 1e-9),
    }


def fused_markdown(results: list[dict], time_limit: float) -> str:
    lines = [
        f"`auto` at {time_limit:g} s per case, seed 0, 2 workers, on {platform.machine()} ({cores()} cores). Zero Bubble's "
        "shape (F = 1, B = 1, W = 0.6, comm 0.03), memory limit p; BW = (B + W) / (1 + split extra). "
        "Cells: makespan / peak memory. Fused: auto's BW ops of all backwards.",
        "",
        "| case | BW | 1f1b (fused) | zb-h1 (split) | auto | fused | lower bound | gap | won by | s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        f, z, a = r["families"]["1f1b"], r["families"]["zb-h1"], r["auto"]
        lines.append(
            f"| {r['case']} | {r['fused_backward']:.3f} | {f['makespan']:.2f} / {f['peak_memory']:.2f} | "
            f"{z['makespan']:.2f} / {z['peak_memory']:.2f} | {a['makespan']:.2f} / {a['peak_memory']:.2f} | "
            f"{a['fused_backwards']}/{a['backwards']} | {a['lower_bound']:.2f} | {a['gap']:.1%} | {a['method_won']} | {a['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def run_suite(suite: str, time_limit: float, seed: int, only: str, output: Path) -> str:
    """Run the named suite, saving JSON and markdown after every case; return the table."""
    run: Callable[[Any, float, int], dict]
    if suite == "slices":
        cases: list = slice_cases()
        run, table_of = run_slice_case, slices_markdown
    else:
        cases = fused_cases()
        run, table_of = run_fused_case, fused_markdown
    cases = [c for c in cases if selected(c.name, only)]
    results: list[dict] = []
    table = ""
    for case in cases:
        result = run(case, time_limit, seed)
        results.append(result)
        a = result["auto"]
        print(
            f"{case.name:24s} auto {a['makespan']:.4g} bound {a['lower_bound']:.4g} gap {a['gap']:.1%} {a['status']} "
            f"({a['method_won']}) {a['seconds']:.0f}s",
            flush=True,
        )
        payload = {"suite": suite, "time_limit": time_limit, "seed": seed, "only": only, "complete": len(results) == len(cases)}
        table = table_of(results, time_limit)
        save_results(output, {**payload, "results": results}, table)
    return table
