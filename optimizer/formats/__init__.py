"""Formats a schedule can be written in, one module each, registered by name.

`pipesched export --format NAME` writes any of them. Each module defines `FORMAT`, a
`ScheduleFormat` with the name, a one-line summary, the usual file suffix and a function
from a schedule to the file's text; adding a format is one module and one line below.
The schedule JSON (optimizer/schedule.py) and the pictures (optimizer/render.py) keep
their home and are registered here through thin modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from optimizer.errors import InputError
from optimizer.schedule import Schedule


@dataclass(frozen=True)
class ScheduleFormat:
    name: str
    summary: str
    suffix: str
    write: Callable[[Schedule], str]


def formats() -> dict[str, ScheduleFormat]:
    """Every registered format by name, in the order `export --help` lists them."""
    from optimizer.formats import chrome_trace, example_split, gantt_html, gantt_svg, layer_lists, megatron_layout, schedule_json, torch_csv

    return {
        module.FORMAT.name: module.FORMAT
        for module in (torch_csv, schedule_json, chrome_trace, gantt_svg, gantt_html, megatron_layout, layer_lists, example_split)
    }


def get_format(name: str) -> ScheduleFormat:
    known = formats()
    if name not in known:
        raise InputError(f"format: '{name}' is not one of {', '.join(known)}")
    return known[name]
