"""Balance benchmark: the layer split chosen with the schedule against the even split and the hand rules.

A 32-block decoder (hidden 4096, sequence 4096, one sequence per microbatch; costs from
FLOPs and bytes, optimizer/layer_costs.py) with vocabularies of 32k, 128k and 256k, on
p = 8 devices with m = 32 microbatches, under two memory limits:

- linear placement at 1F1B's level: the even split's 1F1B peak (activations plus its
  layers' parameter state) on its fullest device;
- V placement at V-Half's level: the even split's V-Half peak likewise.

For each: the family itself on the even split (the naive placement: embedding on the
first stage, head on the last), the even split, each hand rule (fewer blocks on the first
and last stages), and the split `pipesched solve layers.json` chooses, from one run of the
split search (`optimizer.balance.choose_split`), in which each named split and each
searched split that beat them got `auto` for the same share of the time.

Then vocabulary parallelism (`--vocab-parallel`: embedding and head sharded over all
devices, optimizer.vocab_layers): the paper's variant of the family (`1f1b-vocab`,
`v-half-vocab`) with 1 and 2 barriers on the even split of the blocks, and
`pipesched solve layers.json --vocab-parallel` (`optimizer.balance.choose_vocab_split`,
the same time), at two limits: the family's own level with vocabulary parallelism (the
even split's peak under the family plus one pass, with its parameter state: the memory
the paper's variant needs when its passes go in the base order), and the naive level above.

Columns: iteration time (makespan, ms), against the even split, per-device peak memory
(activations plus parameter state, GiB: the largest, the spread between devices in GiB
and as a share of the largest).

    python benchmarks/balance.py [--time-limit 60] [--vocab 32000,128000,256000]
    python benchmarks/balance.py --example      # the example model measured on 2 gloo ranks

Prints a table and writes benchmarks/results/balance.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.script import run_main  # noqa: E402
from optimizer.balance import choose_split, choose_vocab_split  # noqa: E402
from optimizer.exact import SolveOptions, solve  # noqa: E402
from optimizer.formats.schedule_json import load_schedule  # noqa: E402
from optimizer.layer_costs import DecoderSizes, decoder_layers  # noqa: E402
from optimizer.layers import LayersProfile  # noqa: E402
from optimizer.schedule import Schedule  # noqa: E402
from optimizer.schedules import generate  # noqa: E402
from optimizer.split import Placement, SplitInfeasible, even_split, fixed_memory, split_problem  # noqa: E402
from optimizer.vocab_layers import shard_vocabulary  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
LEVELS = {"1f1b": "linear", "v-half": "vshape"}  # memory level (a family) -> the placement it runs on


def level_limit(profile: LayersProfile, placement: Placement, family: str, microbatches: int) -> float:
    """The even split's peak under `family`: activations plus parameter state, fullest device."""
    split = even_split(profile, placement.num_stages)
    schedule = generate(split_problem(profile, placement, split, microbatches), family)
    held = fixed_memory(profile, placement, split)
    return max(peak + h for peak, h in zip(schedule.metrics.peak_memory, held))


def vocab_level_limit(profile: LayersProfile, placement: Placement, family: str, microbatches: int) -> float:
    """The family's level with vocabulary parallelism: the even split of the blocks under
    `family`, plus one pass's memory, plus the parameter state, on the fullest device."""
    trunk, vocab = shard_vocabulary(profile, placement.num_devices, 2)  # the pass memory is the same for 1 barrier
    split = even_split(trunk, placement.num_stages)
    schedule = generate(split_problem(trunk, placement, split, microbatches), family)
    held = fixed_memory(trunk, placement, split, vocab)
    return max(peak + vocab.passes.memory + h for peak, h in zip(schedule.metrics.peak_memory, held))


def row(name: str, split: tuple[int, ...], schedule: Schedule | None, held: list[float] | None, reason: str | None = None) -> dict:
    if schedule is None or held is None:
        return {"split": name, "layers": list(split), "makespan": None, "note": reason}
    peaks = [peak + h for peak, h in zip(schedule.metrics.peak_memory, held)]
    return {
        "split": name,
        "layers": list(split),
        "makespan": schedule.makespan,
        "peak_max": max(peaks),
        "peak_spread": max(peaks) - min(peaks),
        "peak_spread_share": (max(peaks) - min(peaks)) / max(peaks),
        "method": schedule.method,
        "fits": schedule.fits_memory(),
    }


def vocab_rows(
    profile: LayersProfile, placement: Placement, level: str, microbatches: int, limits: dict[str, float], time_limit: float
) -> list[dict]:
    """Vocabulary parallelism at each limit: the paper's variants of `level` on the even split
    of the blocks (1 and 2 barriers), and the split search with `auto`."""
    rows = []
    for limit_name, limit in limits.items():
        where = {"limit_name": limit_name, "limit": limit}
        for barriers in (1, 2):
            trunk, vocab = shard_vocabulary(profile, placement.num_devices, barriers)
            split = even_split(trunk, placement.num_stages)
            try:
                problem = split_problem(trunk, placement, split, microbatches, limit, vocab)
            except SplitInfeasible as error:
                rows.append(row(f"{level}-vocab, {barriers} barrier(s)", split, None, None, str(error)) | where)
                continue
            schedule = generate(problem, f"{level}-vocab")
            rows.append(row(f"{level}-vocab, {barriers} barrier(s)", split, schedule, fixed_memory(trunk, placement, split, vocab)) | where)
        began = time.monotonic()
        result = choose_vocab_split(
            profile, placement, microbatches, limit, SolveOptions(time_limit=time_limit), lambda p, o: solve(p, "auto", o), (1, 2)
        )
        chosen = result.chosen
        assert result.vocab is not None
        r = row(f"vocab auto ({chosen.name}), {result.vocab.barriers} barrier(s)", chosen.split, chosen.schedule, chosen.held)
        rows.append(r | where | {"seconds": time.monotonic() - began})
    return rows


def run_case(vocab: int, level: str, devices: int, microbatches: int, time_limit: float) -> dict:
    profile = decoder_layers(DecoderSizes(vocab=vocab))
    placement = Placement.named(LEVELS[level], devices)
    limit = level_limit(profile, placement, level, microbatches)
    naive_split = even_split(profile, placement.num_stages)
    naive = generate(split_problem(profile, placement, naive_split, microbatches), level)
    began = time.monotonic()
    result = choose_split(profile, placement, microbatches, limit, SolveOptions(time_limit=time_limit), lambda p, o: solve(p, "auto", o))
    seconds = time.monotonic() - began
    # The named splits were solved inside the search with the same share of time as the chosen one.
    shown = [t for t in result.trials if not t.name.startswith("search")]
    if result.chosen not in shown:
        shown.append(result.chosen)
    rows = [row(t.name, t.split, t.schedule, t.held, t.reason) for t in shown]
    for r, t in zip(rows, shown):
        r["chosen"] = t is result.chosen
        r["solver_seconds"] = t.solver_seconds
    even = rows[0]["makespan"]
    rows.insert(0, row(f"{level} (naive)", naive_split, naive, fixed_memory(profile, placement, naive_split)) | {"chosen": False})
    vocab_limit = vocab_level_limit(profile, placement, level, microbatches)
    for r in vocab_rows(profile, placement, level, microbatches, {"vocab level": vocab_limit, "naive level": limit}, time_limit):
        rows.append(r | {"chosen": False})
    for r in rows:
        r["vs_even"] = None if r["makespan"] is None or even is None else r["makespan"] / even - 1
    return {
        "vocab": vocab,
        "level": level,
        "placement": placement.name,
        "limit": limit,
        "vocab_limit": vocab_limit,
        "rows": rows,
        "seconds": seconds,
        "splits_tried": len(result.trials),
    }


def _pipesched(*args: object) -> str:
    """Run the pipesched command line (this checkout) and return its stdout; fail loudly."""
    command = [sys.executable, "-c", "import sys; from runtime.cli import main; sys.exit(main())", *map(str, args)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"pipesched {' '.join(map(str, args))} failed: {done.stderr.strip()}")
    return done.stdout


def example_case(args: argparse.Namespace, folder: Path) -> dict:
    """The example model with a large vocabulary: per-layer profile, even split against the chosen
    one, each solved by `auto` with the same time and run on gloo ranks (measured against predicted)."""
    from optimizer.formats.schedule_json import save_schedule
    from optimizer.layers import load_layers

    model = args.example_model
    layers_file = folder / "layers.json"
    # One rank profiles every layer: give it the threads each of the run's ranks gets (cores / ranks),
    # or every op would be measured faster than it runs.
    threads = max(1, (os.cpu_count() or 1) // args.example_devices)
    _pipesched(
        "profile",
        "--model",
        model,
        "-p",
        1,
        "-m",
        args.example_microbatches,
        "--per-layer",
        "--steps",
        3,
        "--threads",
        threads,
        "-o",
        layers_file,
    )
    profile = load_layers(layers_file)
    placement = Placement.named("linear", args.example_devices)
    options = SolveOptions(time_limit=args.example_time_limit)
    chosen_file, even_file, vocab_file = folder / "chosen.json", folder / "even.json", folder / "vocab.json"
    solve_args = ("-p", args.example_devices, "-m", args.example_microbatches, "--time-limit", args.example_time_limit, "-q")
    _pipesched("solve", layers_file, *solve_args, "-o", chosen_file)
    _pipesched("solve", layers_file, *solve_args, "--vocab-parallel", "-o", vocab_file)
    even = split_problem(profile, placement, even_split(profile, placement.num_stages), args.example_microbatches)
    save_schedule(solve(even, "auto", options), even_file)
    rows = []
    for name, path in (("even", even_file), ("chosen", chosen_file), ("vocab-parallel", vocab_file)):
        summary = json.loads(_pipesched("run", path, "--model", model, "--steps", args.example_steps, "--json"))
        blocks = [sum(1 for layer in stage.layers or [] if layer.kind == "block") for stage in load_schedule(path).problem.stages]
        rows.append(
            {"split": name, "blocks": blocks, "predicted_ms": summary["predicted_makespan"], "measured_ms": summary["median_step_ms"]}
        )
    return {
        "model": model,
        "devices": args.example_devices,
        "microbatches": args.example_microbatches,
        "rows": rows,
        "load": os.getloadavg()[0],
    }


def example_markdown(case: dict) -> str:
    lines = [
        f"Example model `{case['model']}` on {case['devices']} gloo ranks, {case['microbatches']} microbatches "
        f"(per-layer profile on one rank; 1-minute load {case['load']:.1f} at the end):",
        "",
        "| split | blocks per stage | predicted ms | measured ms | measured vs predicted |",
        "|---|---|---:|---:|---:|",
    ]
    for r in case["rows"]:
        lines.append(
            f"| {r['split']} | {'/'.join(map(str, r['blocks']))} | {r['predicted_ms']:.1f} | {r['measured_ms']:.1f} | "
            f"{r['measured_ms'] / r['predicted_ms'] - 1:+.1%} |"
        )
    even = case["rows"][0]
    lines.append("")
    for r in case["rows"][1:]:
        lines.append(
            f"{r['split'].capitalize()} against even: predicted {r['predicted_ms'] / even['predicted_ms'] - 1:+.1%}, "
            f"measured {r['measured_ms'] / even['measured_ms'] - 1:+.1%}."
        )
    return "\n".join(lines) + "\n"


def markdown(cases: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"32-block decoder, hidden 4096, sequence 4096, p={args.devices}, m={args.microbatches}; every split solved by "
        f"one split search of {args.time_limit:g} s per case, every split shown solved by `auto` for the same share of it; "
        f"{platform.machine()}, 2 cores. Memory: activations plus parameter state (GiB).",
        "",
        "| vocab | level (placement) | limit GiB | split | layers per stage | iteration ms | vs even | peak GiB | peak spread GiB | spread % |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for case in cases:
        for r in case["rows"]:
            if r["makespan"] is None:
                cells = ["-", "-", "-", "-", "-"]
            else:
                over = "" if r["fits"] else " (over the limit)"
                cells = [
                    f"{r['makespan']:.0f}",
                    f"{r['vs_even']:+.1%}",
                    f"{r['peak_max']:.1f}{over}",
                    f"{r['peak_spread']:.1f}",
                    f"{r['peak_spread_share']:.1%}",
                ]
            name = f"**{r['split']}** (chosen)" if r["chosen"] else r["split"]
            limit = r.get("limit", case["limit"])
            lines.append(
                f"| {case['vocab'] // 1000}k | {case['level']} ({case['placement']}) | {limit:.1f} | {name} | "
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
    parser.add_argument("--example", action="store_true", help="only the example model measured on gloo ranks")
    parser.add_argument("--example-model", default="example:layers=6,hidden=64,heads=2,vocab=16384,seq_len=32,batch_size=2")
    parser.add_argument("--example-devices", type=int, default=2)
    parser.add_argument("--example-microbatches", type=int, default=8)
    parser.add_argument("--example-time-limit", type=float, default=10.0)
    parser.add_argument("--example-steps", type=int, default=8)
    args = parser.parse_args()
    if args.example:
        with tempfile.TemporaryDirectory() as folder:
            case = example_case(args, Path(folder))
        text = example_markdown(case)
        print(text)
        output = args.output.with_name(args.output.name + "-example")
        output.parent.mkdir(parents=True, exist_ok=True)
        output.with_suffix(".json").write_text(json.dumps(case, indent=1))
        output.with_suffix(".md").write_text(text)
        return
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
    run_main(main)
