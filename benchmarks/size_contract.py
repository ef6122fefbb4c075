"""Size contract benchmark: every command at the largest problem pipesched accepts.

The contract (optimizer/problem.py, README "Size limits") caps a problem at MAX_OPS ops
(3 x stages x microbatches) and at MAX_DEVICES / MAX_MICROBATCHES / MAX_STAGES. This
script runs the real command line, as a user would, on problems just under MAX_OPS in
six shapes (many microbatches, many devices, the V and interleaved placements, the most
stages), and records each command's wall time, process start included. For `solve` and
`pareto` it states the slack: wall time minus `--time-limit`. Prints a table and writes
benchmarks/results/size_contract.json.

    python benchmarks/size_contract.py [--time-limit 2]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from benchmarks.script import run_main
from optimizer.io import write_json_atomic
from optimizer.problem import MAX_OPS

ROOT = Path(__file__).resolve().parents[1]

# (name, devices, microbatches, placement, vocabulary passes): each at most MAX_OPS ops.
SHAPES = [
    ("linear p32 m520", 32, 520, "linear", False),
    ("vshape p32 m260", 32, 260, "vshape", False),
    ("interleaved:4 p16 m260", 16, 260, "interleaved:4", False),
    ("linear p256 m65", 256, 65, "linear", False),
    ("linear p4 m4096", 4, 4096, "linear", False),
    ("interleaved:4 p256 m16", 256, 16, "interleaved:4", False),
    # Many stages on one device (every device-order argument of the bound sees them all).
    ("interleaved:1024 p1 m16", 1, 16, "interleaved:1024", False),
    ("interleaved:512 p2 m16", 2, 16, "interleaved:512", False),
    ("interleaved:341 p3 m16", 3, 16, "interleaved:341", False),
    # Vocabulary passes: every family weaves them in (p x m x 2 more ops).
    ("vshape p32 m192 vocab", 32, 192, "vshape", True),
]


def cli(*args: str) -> tuple[int, float, str]:
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from runtime.cli import main; sys.exit(main())", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    return result.returncode, time.monotonic() - began, result.stderr.strip().splitlines()[-1:][0] if result.stderr.strip() else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--time-limit", type=float, default=2.0)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "size_contract.json")
    args = parser.parse_args()
    limit = args.time_limit
    load_before = os.getloadavg()[0]  # the machine is shared: the load says how much of it we had
    rows = []
    with tempfile.TemporaryDirectory(prefix="pipesched-size-") as folder:
        for name, p, m, placement, vocab in SHAPES:
            problem, schedule, picture, curve = (str(Path(folder) / f) for f in ("p.json", "s.json", "s.svg", "c.json"))
            stages_per_device = int(placement.split(":")[1]) if placement.startswith("interleaved:") else 2 if placement == "vshape" else 1
            steps = [
                ("problem", None, ["problem", "-p", str(p), "-m", str(m), "--placement", placement, "-o", problem]),
                ("solve auto", limit, ["solve", problem, "--time-limit", str(limit), "-q", "-o", schedule]),
                ("compare", None, ["compare", problem, "--json"]),
                # Four microbatches' activations on each device (one stage's forward allocates 1).
                (
                    "pareto (1 limit)",
                    limit,
                    ["pareto", problem, "--limits", str(4 * max(p, stages_per_device)), "--time-limit", str(limit), "-q", "-o", curve],
                ),
                ("validate", None, ["validate", schedule]),
                ("show svg", None, ["show", schedule, "-o", picture]),
            ]
            stages = 0
            for command, time_limit, argv in steps:
                code, seconds, last = cli(*argv)
                if command == "problem":
                    data = json.loads(Path(problem).read_text())
                    stages = len(data["stages"])
                    if vocab:
                        data["vocab_parallel"] = {"forward": 1.0, "backward": 1.0}
                        write_json_atomic(problem, data)
                rows.append(
                    {
                        "shape": name,
                        "ops": 3 * stages * m + (2 * p * m if vocab else 0),
                        "command": command,
                        "exit": code,
                        "seconds": round(seconds, 2),
                        "time_limit": time_limit,
                        "slack": round(seconds - time_limit, 2) if time_limit is not None else None,
                        "stderr": last if code else "",
                    }
                )
                print(f"{name:24} {command:18} exit {code} {seconds:6.2f} s", flush=True)
    table = Table(title=f"every command at the size limit ({MAX_OPS} ops), --time-limit {limit:g}")
    for column in ("shape", "ops", "command", "exit", "seconds", "slack"):
        table.add_column(column, justify="right" if column not in ("shape", "command") else "left")
    for row in rows:
        slack = "-" if row["slack"] is None else f"{row['slack']:.2f}"
        table.add_row(row["shape"], str(row["ops"]), row["command"], str(row["exit"]), f"{row['seconds']:.2f}", slack)
    Console().print(table)
    timed = [row for row in rows if row["slack"] is not None]
    print(f"largest slack over --time-limit: {max(row['slack'] for row in timed):.2f} s")
    setup = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "time_limit": limit,
        "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    write_json_atomic(args.output, {"setup": setup, "max_ops": MAX_OPS, "rows": rows})
    failed = [row for row in rows if row["exit"] != 0]
    if failed:  # every command must finish at the limit: a failure is the contract broken
        for row in failed:
            print(f"FAILED: {row['shape']} {row['command']}: exit {row['exit']}: {row['stderr']}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    run_main(main)
