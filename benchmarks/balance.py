"""Balance benchmark: the layer split chosen with the schedule against the even split and the hand rules.

A 32-block decoder (hidden 4096, sequence 4096, one sequence per microbatch; costs from
FLOPs and bytes, optimizer/layer_costs.py) with vocabularies of 32k, 128k and 256k, on
p = 8 devices with m = 32 microbatches, under two memory limits:

- linear placement at 1F1B's level: the even split's 1F1B peak (activations plus its
  layers' parameter state) on its fullest device;
- V placement at V-Half's level: the even split's V-Half peak likewise.

For each: the even split, each hand rule (fewer blocks on the first and last stages),
and the split `pipesched solve layers.json` chooses, from one run of the split search
(`optimizer.balance.choose_split`), in which each named split and each searched split
that beat them got `auto` for the same share of the time; iteration time (makespan, ms) and per-device peak memory (activations
plus parameter state, GiB: the largest and the spread between devices).

    python benchmarks/balance.py [--time-limit 60] [--vocab 32000,128000,256000]

Prints a table and writes benchmarks/results/balance.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optimizer.balance import choose_split  # noqa: E402
from optimizer.exact import SolveOptions, solve  # noqa: E402
from optimizer.layer_costs import DecoderSizes, decoder_layers  # noqa: E402
from optimizer.layers import LayersProfile  # noqa: E402
from optimizer.schedule import Schedule  # noqa: E402
from optimizer.schedules import generate  # noqa: E402
from optimizer.split import Placement, even_split, fixed_memory, split_problem  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
LEVELS = {"1f1b": "linear", "v-half": "vshape"}  # memory level (a family) -> the placement it runs on


def level_limit(profile: LayersProfile, placement: Placement, family: str, microbatches: int) -> float:
    """The even split's peak under `family`: activations plus parameter state, fullest device."""
    split = even_split(profile, placement.num_stages)
    schedule = generate(split_problem(profile, placement, split, microbatches), family)
    held = fixed_memory(profile, placement, split)
    return max(peak + h for peak, h in zip(schedule.metrics.peak_memory, held))


def row(name: str, split: tuple[int, ...], schedule: Schedule | None, held: list[float], reason: str | None = None) -> dict:
    if schedule is None:
        return {"split": name, "layers": list(split), "makespan": None, "note": reason}
    peaks = [peak + h for peak, h in zip(schedule.metrics.peak_memory, held)]
    return {
        "split": name,
        "layers": list(split),
        "makespan": schedule.makespan,
        "peak_max": max(peaks),
        "peak_spread": max(peaks) - min(peaks),
        "method": schedule.method,
    }


def run_case(vocab: int, level: str, devices: int, microbatches: int, time_limit: float) -> dict:
    profile = decoder_layers(DecoderSizes(vocab=vocab))
    placement = Placement.named(LEVELS[level], devices)
    limit = level_limit(profile, placement, level, microbatches)
    began = time.monotonic()
    result = choose_split(profile, placement, microbatches, limit, SolveOptions(time_limit=time_limit), lambda p, o: solve(p, "auto", o))
    seconds = time.monotonic() - began
    # The named splits were solved inside the search with the same share of time as the chosen one.
    shown = [t for t in result.trials if not t.name.startswith("search")]
    if result.chosen not in shown:
        shown.append(result.chosen)
    rows = [row(t.name, t.split, t.schedule, fixed_memory(profile, placement, t.split), t.reason) for t in shown]
    for r, t in zip(rows, shown):
        r["chosen"] = t is result.chosen
        r["solver_seconds"] = t.solver_seconds
    even = rows[0]["makespan"]
    for r in rows:
        r["vs_even"] = None if r["makespan"] is None or even is None else r["makespan"] / even - 1
    return {
        "vocab": vocab,
        "level": level,
        "placement": placement.name,
        "limit": limit,
        "rows": rows,
        "seconds": seconds,
        "splits_tried": len(result.trials),
    }


def markdown(cases: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"32-block decoder, hidden 4096, sequence 4096, p={args.devices}, m={args.microbatches}; every split solved by "
        f"one split search of {args.time_limit:g} s per case, every split shown solved by `auto` for the same share of it; "
        f"{platform.machine()}, 2 cores. Memory: activations plus parameter state (GiB).",
        "",
        "| vocab | level (placement) | limit GiB | split | layers per stage | iteration ms | vs even | peak GiB | peak spread |",
        "|---|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for case in cases:
        for r in case["rows"]:
            if r["makespan"] is None:
                cells = ["-", "-", "-", "-"]
            else:
                cells = [f"{r['makespan']:.0f}", f"{r['vs_even']:+.1%}", f"{r['peak_max']:.1f}", f"{r['peak_spread']:.1f}"]
            name = f"**{r['split']}** (chosen)" if r["chosen"] else r["split"]
            lines.append(
                f"| {case['vocab'] // 1000}k | {case['level']} ({case['placement']}) | {case['limit']:.1f} | {name} | "
                f"{'/'.join(map(str, r['layers']))} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds of split search per case")
    parser.add_argument("--vocab", default="32000,128000,256000")
    parser.add_argument("--levels", default="1f1b,v-half")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=32)
    parser.add_argument("--output", type=Path, default=RESULTS / "balance")
    args = parser.parse_args()
    cases = []
    for vocab in (int(v) for v in args.vocab.split(",")):
        for level in args.levels.split(","):
            case = run_case(vocab, level, args.devices, args.microbatches, args.time_limit)
            cases.append(case)
            for r in case["rows"]:
                made = "-" if r["makespan"] is None else f"{r['makespan']:.0f} ms ({r['vs_even']:+.1%})"
                print(f"vocab {vocab} {level}: {r['split']:<16} {'/'.join(map(str, r['layers'])):<22} {made}", flush=True)
    text = markdown(cases, args)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps({"args": vars(args) | {"output": str(args.output)}, "cases": cases}, indent=1))
    args.output.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
