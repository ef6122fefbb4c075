"""Schedules a user gives `solve` to start from (`--start`): each one's order timed on the problem.

A start may come from another scheduler (torch's schedule CSV, e.g. one written by
torchtitan or by another tool) or from an earlier solve (a schedule JSON). Only its
per-device order counts: it is timed on the problem being solved, so a schedule solved
for other timings (an earlier profile) still starts the search. The solver keeps the best
schedule it is offered, so it never returns one worse than a start that fits the limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from optimizer.errors import InputError, PipeschedError
from optimizer.io import read_input_text
from optimizer.problem import Problem
from optimizer.schedule import Schedule
from optimizer.validate import checked_schedule

# A start's name in `method_won` and the progress line: the file's name, shortened.
MAX_NAME = 80


@dataclass(frozen=True)
class Start:
    """A given schedule (from `path`) timed on the problem."""

    path: Path
    schedule: Schedule

    @property
    def name(self) -> str:
        """Where it came from, as `method_won` says it."""
        return start_name(self.path)


def start_name(path: Path) -> str:
    name = path.name if len(path.name) <= MAX_NAME else path.name[: MAX_NAME - 3] + "..."
    return f"start({name})"


def load_start(path: str | Path, problem: Problem, option: str = "--start") -> Start:
    """The schedule in `path` (torch CSV when it ends in .csv, else schedule JSON), its order
    timed on `problem`; InputError naming `option` and the file when it is not an order of
    the problem's ops that can run (memory is not checked here: `Schedule.fits_memory`).
    `solve(..., starts=[(start.name, start.schedule)])` takes it."""
    path = Path(path)
    # Imported here: the CSV reader pulls in torch's action names, the JSON reader pydantic models.
    from optimizer.formats import schedule_json, torch_csv

    try:
        if path.suffix.lower() == ".csv":
            schedule, _ = torch_csv.import_schedule(read_input_text(path), problem, str(path), memory=False)
        else:
            given = schedule_json.load_schedule(path, check=False)
            schedule = checked_schedule(problem, given.order(), str(path), start_name(path), memory=False)
    except PipeschedError as error:
        message = str(error)
        named = message if message.startswith(str(path)) else f"{path}: {message}"
        raise InputError(f"{option}: {named}") from None
    return Start(path, schedule)
