"""The linear placement below 1F1B's memory: fewer than p activations per device.

Zero Bubble's heuristic (`zb-auto`) and its paper start at p activations (ZB-1p, ZB-H1's
memory); a user whose memory is shorter still wants a schedule. For Zero Bubble's 1.5B
(p = 8, m = 24), 14.6B (p = 16, m = 48) and 28.3B (p = 32, m = 96) settings
(benchmarks/published.py) at a quarter, half and three quarters of p, at p - 1 and at p:
`zb-auto` with 1F1B's taper of one forward per stage (the heuristic as the paper states
it), `zb-auto` as shipped (depths paced to the memory below p), the list scheduler
(`greedy`), and `auto` at two time limits with its lower bound and gap. Spans are the
longest device span (the paper's objective), in ms.

    python benchmarks/below_p.py [--time-limits 1,5] [--only TEXT] [--output PATH]

Results: benchmarks/results/below_p.json and below_p.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.published import Setting, published_problem, setting_named
from benchmarks.saving import cores, save_results, selected
from benchmarks.script import run_main, seconds_list
from optimizer.exact import SolveOptions, solve
from optimizer.exact.incumbents import objective_value
from optimizer.schedules import generate
from optimizer.schedules.zb_auto import zb_auto
from optimizer.simulate import simulate

RESULTS = Path(__file__).resolve().parent / "results"
SETTING_NAMES = ("1.5B-p8-m24", "14.6B-p16-m48", "28.3B-p32-m96")


def limits_of(p: int) -> list[int]:
    return sorted({p // 4, p // 2, 3 * p // 4, p - 1, p})


def run_case(setting: Setting, limit: int, time_limits: list[float], seed: int) -> dict:
    problem = published_problem(setting, float(limit))
    began = time.monotonic()
    shipped = generate(problem, "zb-auto")
    row: dict = {
        "setting": setting.name,
        "limit": limit,
        "zb_auto_unpaced_span": objective_value(simulate(problem, zb_auto(problem, pacing=False)), "span"),
        "zb_auto_span": objective_value(shipped, "span"),
        "zb_auto_seconds": round(time.monotonic() - began, 2),
        "greedy_span": objective_value(generate(problem, "greedy"), "span"),
        "auto": [],
    }
    for seconds in time_limits:
        began = time.monotonic()
        best = solve(problem, "auto", SolveOptions(time_limit=seconds, seed=seed, threads=2, objective="span"))
        row["auto"].append(
            {
                "time_limit": seconds,
                "span": objective_value(best, "span"),
                "seconds": round(time.monotonic() - began, 2),
                "lower_bound": best.metrics.lower_bound,
                "gap": best.metrics.gap,
                "won_by": best.metrics.method_won,
            }
        )
    return row


def table(results: list[dict], time_limits: list[float]) -> str:
    autos = " | ".join(f"auto {t:g} s" for t in time_limits)
    last = f"{time_limits[-1]:g} s"
    lines = [
        f"Linear placement below 1F1B's memory (limit in activations per device); longest device span in ms; "
        f"`auto` seed 0, 2 workers, {cores()} cores, {platform.machine()}; bound, gap and winner from `auto` at {last}.",
        "",
        f"| setting | limit | zb-auto, 1F1B taper | zb-auto | greedy | {autos} | lower bound | gap | won by |",
        "|---|---:|---:|---:|---:|" + "---:|" * len(time_limits) + "---:|---:|---|",
    ]
    for r in results:
        spans = " | ".join(f"{a['span']:.1f}" for a in r["auto"])
        final = r["auto"][-1]
        lines.append(
            f"| {r['setting']} | {r['limit']} | {r['zb_auto_unpaced_span']:.1f} | {r['zb_auto_span']:.1f} | "
            f"{r['greedy_span']:.1f} | {spans} | {final['lower_bound']:.1f} | {final['gap']:.2%} | {final['won_by']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limits", type=seconds_list, default="1,5", help="comma-separated seconds for the auto runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="run only settings whose name contains this text (or one of these, comma-separated)")
    parser.add_argument("--output", type=Path, default=RESULTS / "below_p.json")
    args = parser.parse_args(argv)
    time_limits = args.time_limits
    results: list[dict] = []
    for setting in (setting_named(n) for n in SETTING_NAMES if selected(n, args.only)):
        for limit in limits_of(setting.p):
            r = run_case(setting, limit, time_limits, args.seed)
            results.append(r)
            autos = ", ".join(f"auto {a['time_limit']:g} s {a['span']:.1f}" for a in r["auto"])
            print(
                f"{setting.name} limit {limit:>2}: zb-auto 1F1B taper {r['zb_auto_unpaced_span']:.1f}, zb-auto "
                f"{r['zb_auto_span']:.1f}, greedy {r['greedy_span']:.1f}, {autos}, gap {r['auto'][-1]['gap']:.2%}",
                flush=True,
            )
            # Saved after every case, so that a run stopped early keeps what it measured.
            save_results(args.output, {"time_limits": time_limits, "seed": args.seed, "results": results}, table(results, time_limits))
    return 0


if __name__ == "__main__":
    run_main(main)
