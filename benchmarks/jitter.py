"""Does `auto`'s lead hold when op times vary? Zero Bubble's settings under random op times.

`auto` tunes an order to the profiled times; a real run varies them. For a few of Zero
Bubble's profiled settings (benchmarks/published.py) at the memory levels where `auto`
beats or matches the automatic schedulers, each of `auto`'s schedule (makespan
objective), the automatic scheduler's (`zb-auto` on the linear placement, `v-auto` on the
V) and the best other family within the limit is timed as soon as possible under
lognormal op-time factors of mean 1 at several coefficients of variation
(optimizer.jitter: the same factors for every schedule in a sample). The table gives each
schedule's nominal makespan and mean makespan at each variation, and `auto`'s lead over
the automatic scheduler, nominal and in the mean.

    python benchmarks/jitter.py [--time-limit 10] [--cvs 0.05,0.1,0.2] [--samples 100] [--only TEXT] [--output PATH]

Results: benchmarks/results/jitter.json and jitter.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.published import published_problem, setting_named
from benchmarks.saving import cores, save_results, selected
from benchmarks.script import positive_seconds, run_main
from optimizer.exact import SolveOptions, solve
from optimizer.exact.options import SEED_RANGE
from optimizer.jitter import check_jitter_request, jittered_makespans, summarize
from optimizer.schedule import Schedule
from optimizer.schedules import generate, generate_all

RESULTS = Path(__file__).resolve().parent / "results"
# (setting, placement, limit in activations per device): linear at 2p (ZB-2p's memory,
# where auto is shorter than the paper) and at p; V at V-Min's and V-Half's levels.
CASES = (
    ("1.5B-p8-m24", "linear", 16.0),
    ("1.5B-p8-m32", "linear", 16.0),
    ("6.2B-p8-m24", "linear", 8.0),
    ("1.5B-p8-m24", "vshape", 4.0),
    ("1.5B-p8-m24", "vshape", 5.0),
    ("14.6B-p16-m48", "vshape", 6.0),
)


def case_name(setting: str, placement: str, limit: float) -> str:
    return f"{setting}-{placement}-limit{limit:g}"


def best_other_family(problem, exclude: set[str]) -> tuple[str, Schedule] | None:
    """The shortest family schedule within the memory limit, other than `exclude`."""
    built, _ = generate_all(problem)
    fitting = [(s.makespan, name, s) for name, s in built.items() if name not in exclude and s.fits_memory()]
    if not fitting:
        return None
    _, name, schedule = min(fitting, key=lambda t: (t[0], t[1]))
    return name, schedule


def run_case(setting: str, placement: str, limit: float, time_limit: float, cvs: list[float], samples: int, seed: int) -> dict:
    problem = published_problem(setting_named(setting), limit, placement)
    automatic = "zb-auto" if placement == "linear" else "v-auto"
    schedules = {"auto": solve(problem, "auto", SolveOptions(time_limit=time_limit, seed=seed, threads=2))}
    schedules[automatic] = generate(problem, automatic)
    other = best_other_family(problem, {automatic})
    if other is not None:
        schedules[other[0]] = other[1]
    names = list(schedules)
    row: dict = {"case": case_name(setting, placement, limit), "schedules": {n: {"nominal": schedules[n].makespan} for n in names}}
    for cv in cvs:
        check_jitter_request(cv, samples, len(names), problem.num_ops)
        values = jittered_makespans(problem, [schedules[n] for n in names], cv, samples, seed)
        for name, makespans in zip(names, values, strict=True):
            summary = summarize(schedules[name].makespan, makespans)
            row["schedules"][name][f"cv{cv:g}"] = {"mean": summary.mean, "p95": summary.p95}
    row["automatic"] = automatic
    return row


def lead(row: dict, key: str | None) -> float:
    """auto's lead over the automatic scheduler: how much shorter, as a share of the latter."""
    auto, theirs = row["schedules"]["auto"], row["schedules"][row["automatic"]]
    a, t = (auto["nominal"], theirs["nominal"]) if key is None else (auto[key]["mean"], theirs[key]["mean"])
    return 1 - a / t


def table(results: list[dict], cvs: list[float], samples: int, time_limit: float, seed: int) -> str:
    means = " | ".join(f"mean, cv {cv:g}" for cv in cvs)
    leads = " | ".join(f"lead, cv {cv:g}" for cv in cvs)
    lines = [
        f"Makespan in ms (as soon as possible, as the executor runs an order), nominal and mean over {samples} samples of "
        f"lognormal op-time factors (mean 1, coefficient of variation cv; the same factors for every schedule); `auto` at "
        f"{time_limit:g} s, makespan objective, seed {seed}, 2 workers, {cores()} cores, {platform.machine()}. Lead: how much "
        f"shorter `auto` is than the automatic scheduler (zb-auto / v-auto).",
        "",
        f"| case | schedule | nominal | {means} | nominal lead | {leads} |",
        "|---|---|---:|" + "---:|" * len(cvs) + "---:|" + "---:|" * len(cvs),
    ]
    for r in results:
        for name, figures in r["schedules"].items():
            cells = " | ".join(f"{figures[f'cv{cv:g}']['mean']:.1f}" for cv in cvs)
            leading = (
                f"{lead(r, None):+.2%} | " + " | ".join(f"{lead(r, f'cv{cv:g}'):+.2%}" for cv in cvs)
                if name == "auto"
                else " | ".join([""] * (len(cvs) + 1))
            )
            lines.append(f"| {r['case']} | {name} | {figures['nominal']:.1f} | {cells} | {leading} |")
    return "\n".join(lines) + "\n"


def cv_list(text: str) -> list[float]:
    values = [float(part) for part in text.split(",")]
    for value in values:
        if not 0 < value <= 1:
            raise argparse.ArgumentTypeError(f"a coefficient of variation must be above 0 and at most 1, got {value:g}")
    return values


def seed_value(text: str) -> int:
    """An argparse type: a seed within the solver's range."""
    value = int(text)
    if not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise argparse.ArgumentTypeError(f"must be between {SEED_RANGE[0]} and {SEED_RANGE[1]}, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=positive_seconds, default=10.0, help="seconds for each auto solve")
    parser.add_argument("--cvs", type=cv_list, default="0.05,0.1,0.2", help="comma-separated coefficients of variation")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--seed", type=seed_value, default=0)
    parser.add_argument("--only", default="", help="run only cases whose name contains this text (or one of these, comma-separated)")
    parser.add_argument("--output", type=Path, default=RESULTS / "jitter.json")
    args = parser.parse_args(argv)
    for cv in args.cvs:
        check_jitter_request(cv, args.samples, 1, 1)  # the sample count, before any solve
    results: list[dict] = []
    for setting, placement, limit in CASES:
        if not selected(case_name(setting, placement, limit), args.only):
            continue
        r = run_case(setting, placement, limit, args.time_limit, args.cvs, args.samples, args.seed)
        results.append(r)
        leads = ", ".join(f"cv {cv:g} {lead(r, f'cv{cv:g}'):+.2%}" for cv in args.cvs)
        print(f"{r['case']}: auto's lead over {r['automatic']} nominal {lead(r, None):+.2%}, in the mean {leads}", flush=True)
        payload = {"time_limit": args.time_limit, "cvs": args.cvs, "samples": args.samples, "seed": args.seed, "results": results}
        save_results(args.output, payload, table(results, args.cvs, args.samples, args.time_limit, args.seed))
    return 0


if __name__ == "__main__":
    run_main(main)
