"""`make demo`: solve the built-in example problem and show how it compares.

The example is a 4-device pipeline of a GPT-style model whose first stage carries the
embedding (x1.2) and whose last stage carries the vocabulary projection and loss (x1.8),
under a memory limit of 4 microbatch activations per device: the case hand-made
schedules are not built for.
"""

from __future__ import annotations

from pathlib import Path

from optimizer.cli import comparison_rows, metrics_line, print_comparison
from optimizer.problem import Problem
from optimizer.render import write_rendering
from optimizer.schedule import save_schedule
from optimizer.schedules import generate_all


def example_problem() -> Problem:
    """4 devices, 8 microbatches, uneven stages (ms), memory in microbatch activations."""
    base = {"forward": 10.0, "backward_input": 10.0, "backward_weight": 6.5}
    scale = [1.2, 1.0, 1.0, 1.8]
    stages = []
    for device, factor in enumerate(scale):
        timing = {name: value * factor for name, value in base.items()}
        if device == len(scale) - 1:
            timing["backward_weight"] = base["backward_weight"] * 1.2  # the loss has no weights
        stages.append(
            {"device": device, **timing, "memory": {"forward": 1.0, "backward_input": -0.63, "backward_weight": -0.37}}
        )
    return Problem.model_validate(
        {"num_devices": 4, "num_microbatches": 8, "stages": stages, "comm_time": 0.3, "memory_limit": 4.0}
    )


def main(output_dir: Path = Path(".")) -> None:
    problem = example_problem()
    print_comparison(comparison_rows(problem), "example: 4 devices, 8 microbatches, uneven stages, memory limit 4")
    fitting = [s for s in generate_all(problem).values() if s.fits_memory()]
    best = min(fitting, key=lambda s: s.makespan)
    schedule_path, picture_path = output_dir / "schedule.json", output_dir / "schedule.svg"
    save_schedule(best, schedule_path)
    write_rendering(best, picture_path)
    print(metrics_line(best))
    print(f"wrote {schedule_path} and {picture_path}")


if __name__ == "__main__":
    main()
