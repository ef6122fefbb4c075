"""Every memory limit, not only the papers' levels: the V placement from V-Min's level to 2p.

A user's limit is whatever memory is left after the model's weights, rarely exactly one
of the levels the V families were built for. For Zero Bubble's 1.5B (p = 8, m = 24),
14.6B (p = 16, m = 48) and 28.3B (p = 32, m = 96) settings on the V placement
(benchmarks/published.py), at every
integer limit from V-Min's level (p+4)//3 up to p, and at 2p: the best fixed V family
that fits (V-Min, V-Half, ZB-V, DualPipe-V), `v-auto` with its constant-slope blocks
only and no reordered blocks, `v-auto` with bent blocks but no reordered ones, `v-auto`
as shipped, and `auto` at `--time-limit` seconds with its lower bound and gap. Spans are
the longest device span (the paper's objective).

    python benchmarks/limits.py [--time-limit 5] [--only TEXT] [--output PATH]

Results: benchmarks/results/limits.json and limits.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.published import Setting, published_problem, setting_named
from benchmarks.saving import save_results, selected
from benchmarks.script import run_main
from optimizer.exact import SolveOptions, solve
from optimizer.exact.incumbents import objective_value
from optimizer.schedules import generate
from optimizer.schedules.v_auto import v_auto
from optimizer.simulate import simulate

RESULTS = Path(__file__).resolve().parent / "results"
SETTING_NAMES = ("1.5B-p8-m24", "14.6B-p16-m48", "28.3B-p32-m96")
FAMILIES = ("v-min", "v-half", "zb-v", "dualpipe-v")


def limits_of(p: int) -> list[int]:
    return list(range((p + 4) // 3, p + 1)) + [2 * p]


def run_case(setting: Setting, limit: int, time_limit: float, seed: int) -> dict:
    problem = published_problem(setting, float(limit), "vshape")
    families = {name: generate(problem, name) for name in FAMILIES}
    fitting = {name: objective_value(s, "span") for name, s in families.items() if s.fits_memory()}
    family = min(fitting, key=fitting.__getitem__) if fitting else None
    began = time.monotonic()
    shipped = generate(problem, "v-auto")
    v_auto_seconds = time.monotonic() - began
    constant = simulate(problem, v_auto(problem, bends=False, reorder=False))
    unreordered = simulate(problem, v_auto(problem, reorder=False))
    began = time.monotonic()
    best = solve(problem, "auto", SolveOptions(time_limit=time_limit, seed=seed, threads=2, objective="span"))
    return {
        "setting": setting.name,
        "limit": limit,
        "family": family,
        "family_span": fitting.get(family) if family else None,
        "constant_slopes_span": objective_value(constant, "span"),
        "not_reordered_span": objective_value(unreordered, "span"),
        "v_auto_span": objective_value(shipped, "span"),
        "v_auto_seconds": round(v_auto_seconds, 2),
        "auto_span": objective_value(best, "span"),
        "auto_bubble": best.metrics.bubble_ratio,
        "auto_seconds": round(time.monotonic() - began, 2),
        "lower_bound": best.metrics.lower_bound,
        "gap": best.metrics.gap,
        "won_by": best.metrics.method_won,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(results: list[dict], time_limit: float) -> str:
    lines = [
        f"V placement at every integer limit from V-Min's level to p, and 2p (activations per device); "
        f"longest device span in ms; `auto` at {time_limit:g} s, seed 0, 2 workers, on {platform.machine()}.",
        "",
        "| setting | limit | best V family | its span | v-auto, constant slopes | v-auto, not reordered | v-auto | auto | auto bubble "
        "| lower bound | gap | won by |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['setting']} | {r['limit']} | {r['family'] or '(none fits)'} | {_ms(r['family_span'])} | "
            f"{_ms(r['constant_slopes_span'])} | {_ms(r.get('not_reordered_span'))} | {_ms(r['v_auto_span'])} | "
            f"{_ms(r['auto_span'])} | {r['auto_bubble']:.2%} | "
            f"{_ms(r['lower_bound'])} | {r['gap']:.2%} | {r['won_by']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=5.0, help="seconds for each auto run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="run only settings whose name contains this text (or one of these, comma-separated)")
    parser.add_argument("--output", type=Path, default=RESULTS / "limits.json")
    args = parser.parse_args(argv)
    results: list[dict] = []
    for setting in (setting_named(n) for n in SETTING_NAMES if selected(n, args.only)):
        for limit in limits_of(setting.p):
            r = run_case(setting, limit, args.time_limit, args.seed)
            results.append(r)
            print(
                f"{setting.name} limit {limit:>2}: family {_ms(r['family_span']):>7} ({r['family']}), v-auto constant "
                f"{_ms(r['constant_slopes_span'])}, v-auto {_ms(r['v_auto_span'])}, auto {_ms(r['auto_span'])} "
                f"gap {r['gap']:.2%}",
                flush=True,
            )
            # Saved after every case, so that a run stopped early keeps what it measured.
            save_results(
                args.output, {"time_limit": args.time_limit, "seed": args.seed, "results": results}, table(results, args.time_limit)
            )
    return 0


if __name__ == "__main__":
    run_main(main)
