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


# Pictures and documents outside pipesched's formats that a JSON file must not be named as.
_OTHER_SUFFIXES = (".png", ".jpg", ".jpeg", ".pdf")


def refuse_other_format(output: str | Path | None, writes: str) -> None:
    """Refuse an output named like another format (`solve -o s.svg` would be JSON in an
    .svg): the commands that write one kind of JSON (a problem, a layers file, a schedule,
    a Pareto curve) have no other format to pick. A name with no known suffix is taken
    (a device, a pipe)."""
    if output is None:
        return
    file_name = Path(output).name.lower()
    # Plain .json is theirs; .trace.json and .modules.json are read as a trace and a module
    # list by `show` and the exports.
    suffixes = [f.suffix for f in formats().values() if f.suffix != ".json"] + list(_OTHER_SUFFIXES)
    matched = [suffix for suffix in suffixes if file_name.endswith(suffix)]
    if matched:
        suffix = max(matched, key=len)
        raise InputError(
            f"{output}: a {suffix} name, but this writes {writes} as JSON (name it .json; pictures and other formats: pipesched show or export)"
        )
