"""`make demo`: solve the built-in example problem with `auto` and show how it compares.

The example is a 4-device pipeline of a GPT-style model whose first stage carries the
embedding (x1.1) and whose last stage carries the vocabulary projection and loss (x1.3),
under a memory limit of 3 microbatch activations per device: the case hand-made
schedules are not built for.
"""

from __future__ import annotations

from pathlib import Path

from optimizer.cli import comparison_rows, metrics_line, print_comparison
from optimizer.exact import SolveOptions, solve
from optimizer.formats.gantt_svg import gantt_svg
from optimizer.formats.schedule_json import save_schedule
from optimizer.io import write_text_atomic
from optimizer.problem import Problem


def example_problem() -> Problem:
    """4 devices, 8 microbatches, uneven stages (ms), memory in microbatch activations."""
    base = {"forward": 10.0, "backward_input": 10.0, "backward_weight": 6.5}
    scale = [1.1, 1.0, 1.0, 1.3]
    stages = []
    for device, factor in enumerate(scale):
        timing = {name: value * factor for name, value in base.items()}
        if device == len(scale) - 1:
            timing["backward_weight"] = base["backward_weight"] * 1.2  # the loss adds no weights: W grows less than F and B
        stages.append({"device": device, **timing, "memory": {"forward": 1.0, "backward_input": -0.63, "backward_weight": -0.37}})
    return Problem.model_validate({"num_devices": 4, "num_microbatches": 8, "stages": stages, "comm_time": 0.3, "memory_limit": 3.0})


def main(output_dir: Path = Path("."), time_limit: float = 10.0) -> None:
    problem = example_problem()
    solved = solve(problem, "auto", SolveOptions(time_limit=time_limit))
    title = f"example: 4 devices, 8 microbatches, uneven stages, memory limit 3; auto with a {time_limit:g} s limit"
    print_comparison(comparison_rows(problem, extra={"auto": solved}), title)
    schedule_path, picture_path = output_dir / "schedule.json", output_dir / "schedule.svg"
    save_schedule(solved, schedule_path)
    write_text_atomic(picture_path, gantt_svg(solved))
    print(metrics_line(solved))
    print(f"wrote {schedule_path} and {picture_path}")


if __name__ == "__main__":
    main()
