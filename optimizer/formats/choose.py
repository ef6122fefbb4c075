"""Which format a file is written in: `--format NAME`, else the end of the file's name.

One rule for every command. An explicit `--format` wins; otherwise the longest suffix of
a registered format (of what the command writes: a schedule or a Pareto curve) that the
file name ends with. So `.json` means a schedule JSON wherever a schedule is written,
`.trace.json` a Chrome trace, `.csv` torch's CSV, `.svg` and `.html` the Gantt chart;
for a Pareto curve, `.json` is the curve and `.svg` its plot. A command that writes
only some formats (`show`: the pictures) says so and names the way to the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from optimizer.errors import InputError
from optimizer.formats import ScheduleFormat, formats


def choose_format(
    output: str | Path, name: str | None = None, subject: str = "schedule", allowed: Sequence[str] | None = None
) -> ScheduleFormat:
    """The format to write `output` in; InputError when none fits or `allowed` excludes it.

    `allowed`: the format names this command writes (all of `subject`'s when None).
    """
    known = {key: chosen for key, chosen in formats().items() if chosen.subject == subject}
    names = list(allowed) if allowed is not None else list(known)
    if name is not None:
        if name not in names:
            raise InputError(f"format: '{name}' is not one of {', '.join(names)}")
        return known[name]
    file_name = Path(output).name.lower()
    matches = [chosen for chosen in known.values() if file_name.endswith(chosen.suffix)]
    if not matches:
        suffixes = ", ".join(known[key].suffix for key in names)
        raise InputError(f"{output}: no format ends the name like this (use {suffixes}, or --format {'|'.join(names)})")
    chosen = max(matches, key=lambda candidate: len(candidate.suffix))
    if chosen.name not in names:
        others = " or ".join(f"{known[key].suffix} ({key})" for key in names)
        raise InputError(f"{output}: a {chosen.suffix} file is a {chosen.name}; this command writes {others}, or give --format")
    return chosen
