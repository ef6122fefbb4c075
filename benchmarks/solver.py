"""Solver benchmark: `auto` against every known schedule, with lower bounds and gaps.

Grid: p in {4, 8, 16, 32}, m in {2p, 3p, 4p, 8p}; two timing profiles shaped like the
Zero Bubble paper's measurements (per transformer stage, in units of one forward):

* uniform: F = 1, B = 1, W = 0.6, comm = 0.03; memory F +1, B -0.63, W -0.37;
* heterogeneous: the same, with the first stage x1.2 (embedding), the last stage
  F x1.5, B x2, W x1.5 (vocabulary projection and loss), and the middle stage x1.25
  (one extra layer);

two placements: linear (one stage per device) and V (two half-size chunks per device,
so device 0 holds both the embedding and the loss chunk); and three memory limits,
in units of one microbatch's activations of a device's share of the model:
(p+4)//3 (V-Min's level), p (1F1B, ZB-H1, ZB-V) and 2p (every schedule fits).

Each case gets `--time-limit` seconds (60 by default). The default run takes a fixed
sample of 12 cases (about 13 minutes); `--full` runs all 192. Results go to
benchmarks/results/solver.json and solver.md.

`--suite published` runs the Zero Bubble paper's 12 profiled settings instead
(benchmarks/published.py): linear placement at limits p and 2p microbatch activations
(the paper's ZB-1p and ZB-2p, whose published bubble rates are listed), and the V
placement (the same work in 2p half-size chunks) at V-Min's level (p+4)//3, V-Half's
(p+2)//2, p and 2p. Per case: `zb-auto` / `v-auto`, the best other family that fits, and
`auto` with the paper's objective (longest device span) at each of `--time-limits`
(5 and 60 s by default), its lower bound, gap and the phase that won; `its s` is the
automatic scheduler's own build time. Results go to
benchmarks/results/published.json and published.md.

`--suite slices` and `--suite fused` (benchmarks/sliced_suites.py): token slices of a long
sequence, and the fused-or-split backward, each case at `--time-limit`; results go to
benchmarks/results/slices.json and .md, fused.json and .md.

    python benchmarks/solver.py [--full] [--time-limit 60] [--only TEXT]
    python benchmarks/solver.py --suite published [--time-limits 5,60] [--only TEXT]
    python benchmarks/solver.py --suite slices|fused [--time-limit 60] [--only TEXT]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.published import SETTINGS, Setting, published_problem
from benchmarks.saving import cores, save_results, selected
from benchmarks.script import run_main, seconds_list
from benchmarks.sliced_suites import run_suite
from optimizer.exact import SolveOptions, solve
from optimizer.exact.incumbents import generator_candidates, objective_value
from optimizer.problem import Problem, placement_devices
from optimizer.schedules import get_generator

RESULTS = Path(__file__).resolve().parent / "results"

FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, COMM = 1.0, 1.0, 0.6, 0.03
MEMORY = (1.0, -0.63, -0.37)


@dataclass(frozen=True)
class Case:
    p: int
    m: int
    profile: str  # "uniform" | "hetero"
    placement: str  # "linear" | "vshape"
    limit_level: str  # "vmin" | "p" | "2p"

    @property
    def name(self) -> str:
        return f"p{self.p}-m{self.m}-{self.profile}-{self.placement}-mem{self.limit_level}"

    def limit(self) -> float:
        return {"vmin": float((self.p + 4) // 3), "p": float(self.p), "2p": 2.0 * self.p}[self.limit_level]


def layer_factors(num_stages: int, profile: str) -> list[tuple[float, float, float]]:
    """Per model stage (in model order), multipliers of (F, B, W)."""
    factors = [(1.0, 1.0, 1.0)] * num_stages
    if profile == "hetero":
        factors = list(factors)
        factors[num_stages // 2] = (1.25, 1.25, 1.25)
        factors[0] = (1.2, 1.2, 1.2)
        factors[-1] = (1.5, 2.0, 1.5)
    return factors


def build_problem(case: Case) -> Problem:
    devices = placement_devices(case.placement, case.p)
    share = 1.0 / (len(devices) // case.p)  # a V chunk is half a device's share
    stages = []
    for device, (f, b, w) in zip(devices, layer_factors(len(devices), case.profile)):
        stages.append(
            {
                "device": device,
                "forward": round(FORWARD * f * share, 6),
                "backward_input": round(BACKWARD_INPUT * b * share, 6),
                "backward_weight": round(BACKWARD_WEIGHT * w * share, 6),
                "memory": {
                    "forward": MEMORY[0] * share,
                    "backward_input": MEMORY[1] * share,
                    "backward_weight": round(-(MEMORY[0] + MEMORY[1]) * share, 6),
                },
            }
        )
    return Problem.model_validate(
        {"num_devices": case.p, "num_microbatches": case.m, "stages": stages, "comm_time": COMM, "memory_limit": case.limit()}
    )


def full_grid() -> list[Case]:
    return [
        Case(p, k * p, profile, placement, level)
        for p in (4, 8, 16, 32)
        for k in (2, 3, 4, 8)
        for profile in ("uniform", "hetero")
        for placement in ("linear", "vshape")
        for level in ("vmin", "p", "2p")
    ]


SAMPLE = [
    Case(4, 8, "uniform", "linear", "vmin"),
    Case(4, 16, "hetero", "linear", "p"),
    Case(4, 8, "hetero", "vshape", "vmin"),
    Case(4, 16, "uniform", "vshape", "2p"),
    Case(8, 16, "hetero", "linear", "vmin"),
    Case(8, 32, "uniform", "vshape", "p"),
    Case(8, 24, "hetero", "vshape", "vmin"),
    Case(16, 32, "hetero", "linear", "p"),
    Case(16, 64, "uniform", "vshape", "vmin"),
    Case(32, 64, "hetero", "vshape", "p"),
    Case(32, 256, "uniform", "linear", "2p"),
    Case(32, 256, "hetero", "linear", "p"),
]


def run_case(case: Case, time_limit: float, seed: int) -> dict:
    problem = build_problem(case)
    generators, failed = generator_candidates(problem)
    rows = {c.name: {"makespan": c.schedule.makespan, "bubble": c.schedule.metrics.bubble_ratio, "fits": c.fits} for c in generators}
    fitting = [c for c in generators if c.fits]
    best = min(fitting, key=lambda c: c.schedule.makespan, default=None)
    began = time.monotonic()
    schedule = solve(problem, "auto", SolveOptions(time_limit=time_limit, seed=seed, threads=2))
    seconds = time.monotonic() - began
    m = schedule.metrics
    return {
        "case": case.name,
        "p": case.p,
        "m": case.m,
        "profile": case.profile,
        "placement": case.placement,
        "memory_limit": case.limit(),
        "generators": rows,
        "generator_errors": failed,
        "best_generator": None
        if best is None
        else {"name": best.name, "makespan": best.schedule.makespan, "bubble": best.schedule.metrics.bubble_ratio},
        "auto": {
            "makespan": m.makespan,
            "bubble": m.bubble_ratio,
            "lower_bound": m.lower_bound,
            "gap": m.gap,
            "status": m.status,
            "method_won": m.method_won,
            "seconds": round(seconds, 2),
            "peak_memory": max(m.peak_memory),
        },
    }


def markdown(results: list[dict], time_limit: float) -> str:
    lines = [
        f"Time limit {time_limit:g} s per case on {platform.machine()} ({cores()} cores). Bubble: Zero Bubble convention; "
        "gap: (makespan - lower bound) / makespan; gain: auto's makespan below the best generator that fits the limit.",
        "",
        "| case | generators' bubble (✗ over the limit) | best fitting | auto bubble | gain | gap | status | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        gens = ", ".join(f"{name} {row['bubble']:.1%}{'' if row['fits'] else ' ✗'}" for name, row in r["generators"].items())
        best = r["best_generator"]
        a = r["auto"]
        best_text = "none fits" if best is None else f"{best['name']} {best['bubble']:.1%}"
        gain = "-" if best is None else f"{(best['makespan'] - a['makespan']) / best['makespan']:.1%}"
        lines.append(
            f"| {r['case']} | {gens} | {best_text} | {a['bubble']:.1%} | {gain} | {a['gap']:.1%} | {a['status']} | {a['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


# -- The published suite: the Zero Bubble paper's settings ------------------------------


@dataclass(frozen=True)
class PublishedCase:
    setting: Setting
    placement: str  # "linear" | "vshape"
    level: str  # "vmin" | "vhalf" | "p" | "2p"

    @property
    def name(self) -> str:
        return f"{self.setting.name}-{self.placement}-mem{self.level}"

    def limit(self) -> float:
        p = self.setting.p
        return float({"vmin": (p + 4) // 3, "vhalf": (p + 2) // 2, "p": p, "2p": 2 * p}[self.level])

    @property
    def published(self) -> float | None:
        """The paper's bubble rate (ZB-1p at limit p, ZB-2p at 2p; linear placement only)."""
        if self.placement != "linear":
            return None
        return self.setting.zb_1p if self.level == "p" else self.setting.zb_2p

    @property
    def ours(self) -> str:
        return "zb-auto" if self.placement == "linear" else "v-auto"


def published_cases() -> list[PublishedCase]:
    linear = [PublishedCase(s, "linear", level) for s in SETTINGS for level in ("p", "2p")]
    vshape = [PublishedCase(s, "vshape", level) for s in SETTINGS for level in ("vmin", "vhalf", "p", "2p")]
    return linear + vshape


def run_published_case(case: PublishedCase, time_limits: list[float], seed: int) -> dict:
    problem = published_problem(case.setting, case.limit(), case.placement)
    began = time.monotonic()
    get_generator(case.ours).build(problem)
    ours_seconds = time.monotonic() - began
    began = time.monotonic()
    candidates, failed = generator_candidates(problem)
    generator_seconds = time.monotonic() - began
    rows = {
        c.name: {"bubble": c.schedule.metrics.bubble_ratio, "span": objective_value(c.schedule, "span"), "fits": c.fits} for c in candidates
    }
    others = [c for c in candidates if c.fits and c.name != case.ours]
    best_other = min(others, key=lambda c: objective_value(c.schedule, "span"), default=None)
    runs = []
    for limit in time_limits:
        began = time.monotonic()
        schedule = solve(problem, "auto", SolveOptions(time_limit=limit, seed=seed, threads=2, objective="span"))
        m = schedule.metrics
        runs.append(
            {
                "time_limit": limit,
                "bubble": m.bubble_ratio,
                "span": objective_value(schedule, "span"),
                "lower_bound": m.lower_bound,
                "gap": m.gap,
                "status": m.status,
                "method_won": m.method_won,
                "seconds": round(time.monotonic() - began, 2),
                "peak_memory": max(m.peak_memory),
            }
        )
    return {
        "case": case.name,
        "model": case.setting.model,
        "p": case.setting.p,
        "m": case.setting.m,
        "placement": case.placement,
        "level": case.level,
        "memory_limit": case.limit(),
        "published": case.published,
        "ours": {"name": case.ours, "seconds": round(ours_seconds, 2), **rows.get(case.ours, {"error": failed.get(case.ours, "missing")})},
        "best_other": None if best_other is None else {"name": best_other.name, **rows[best_other.name]},
        "generators": rows,
        "generator_errors": failed,
        "generator_seconds": round(generator_seconds, 2),
        "auto": runs,
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def published_markdown(results: list[dict], time_limits: list[float]) -> str:
    limits = ", ".join(f"{t:g}" for t in time_limits)
    auto_headers = " | ".join(f"auto {t:g} s" for t in time_limits)
    lines = [
        f"`auto` at {limits} s per case (objective: longest device span, the paper's), seed 0, 2 workers, on "
        f"{platform.machine()} ({cores()} cores). Bubble: Zero Bubble convention. Published: the paper's Table 5 "
        "(ZB-1p at limit p, ZB-2p at 2p). Limit in microbatch activations per device (M_B). Lower bound and gap "
        "(of the span) from the longest run.",
        "",
        f"| case | limit | published | zb-auto / v-auto | its s | best other family | {auto_headers} | lower bound | gap | won by |",
        "|---|---:|---:|---:|---:|---|" + "---:|" * len(time_limits) + "---:|---:|---|",
    ]
    for r in results:
        ours = r["ours"]
        ours_text = _pct(ours.get("bubble")) + ("" if ours.get("fits", False) else " ✗")
        other = r["best_other"]
        other_text = "none fits" if other is None else f"{other['name']} {other['bubble']:.2%}"
        autos = " | ".join(_pct(run["bubble"]) for run in r["auto"])
        last = r["auto"][-1]
        lines.append(
            f"| {r['case']} | {r['memory_limit']:g} | {_pct(r['published'])} | {ours_text} | {ours['seconds']:.1f} | {other_text} | {autos} | "
            f"{last['lower_bound']:.4g} | {_pct(last['gap'])} | {last['method_won']} |"
        )
    return "\n".join(lines) + "\n"


def main_published(args: argparse.Namespace) -> None:
    time_limits = args.time_limits
    cases = [c for c in published_cases() if selected(c.name, args.only)]
    output = args.output or RESULTS / "published.json"
    results: list[dict] = []
    table = ""
    for case in cases:
        result = run_published_case(case, time_limits, args.seed)
        results.append(result)
        ours = result["ours"]
        autos = " ".join(f"auto@{run['time_limit']:g}s {run['bubble']:.2%} ({run['method_won']})" for run in result["auto"])
        print(
            f"{case.name:32s} published {_pct(result['published']):>7s} {ours['name']} {_pct(ours.get('bubble')):>7s} {autos} "
            f"gap {_pct(result['auto'][-1]['gap'])}",
            flush=True,
        )
        # Saved after every case, so that a long run stopped early keeps what it measured.
        table = _save_published(output, results, time_limits, args, complete=len(results) == len(cases))
    print()
    print(table)


def _save_published(output: Path, results: list[dict], time_limits: list[float], args: argparse.Namespace, complete: bool) -> str:
    output.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "suite": "published",
        "time_limits": time_limits,
        "seed": args.seed,
        "only": args.only,
        "complete": complete,
        "results": results,
    }
    table = published_markdown(results, time_limits)
    save_results(output, payload, table)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--suite",
        choices=("grid", "published", "slices", "fused"),
        default="grid",
        help="the grid (default), the Zero Bubble paper's settings, token slices or fused-or-split backwards",
    )
    parser.add_argument("--full", action="store_true", help="run the whole grid (192 cases) instead of the sample")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per case (grid suite)")
    parser.add_argument("--time-limits", type=seconds_list, default="5,60", help="comma-separated seconds per auto run (published suite)")
    parser.add_argument("--only", default="", help="run only cases whose name contains this text (or one of these, comma-separated)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None, help="results JSON (default: results/solver.json or published.json)")
    args = parser.parse_args()
    if args.suite == "published":
        main_published(args)
        return
    if args.suite in ("slices", "fused"):
        output = args.output or RESULTS / f"{args.suite}.json"
        print()
        print(run_suite(args.suite, args.time_limit, args.seed, args.only, output))
        return
    args.output = args.output or RESULTS / "solver.json"

    cases = [c for c in (full_grid() if args.full else SAMPLE) if selected(c.name, args.only)]
    results = []
    for case in cases:
        result = run_case(case, args.time_limit, args.seed)
        results.append(result)
        a, best = result["auto"], result["best_generator"]
        best_text = "none fits" if best is None else f"{best['name']} {best['makespan']:.4g}"
        print(
            f"{case.name:38s} best {best_text:22s} auto {a['makespan']:.4g} bound {a['lower_bound']:.4g} "
            f"gap {a['gap']:.1%} {a['status']} ({a['method_won']}) {a['seconds']:.0f}s",
            flush=True,
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    payload = {"time_limit": args.time_limit, "full": args.full, "seed": args.seed, "results": results}
    table = markdown(results, args.time_limit)
    save_results(args.output, payload, table)
    print()
    print(table)


if __name__ == "__main__":
    run_main(main)
