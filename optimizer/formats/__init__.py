"""Formats a schedule (or a Pareto curve) can be written in, one module each, registered by name.

`pipesched export --format NAME` writes any schedule format, `show` the pictures, `pareto`
the curve's. Each module defines `FORMAT`, a `ScheduleFormat` with the name, a one-line
summary, the usual file suffix, a function from the subject to the file's text and the
subject it writes ("schedule" or "pareto"); adding a format is one module and one line
below. Which format a file gets, from `--format` or its name: optimizer/formats/choose.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from optimizer.errors import InputError


@dataclass(frozen=True)
class ScheduleFormat:
    name: str
    summary: str
    suffix: str
    write: Callable[[Any], str]  # from a Schedule (or a ParetoCurve when subject is "pareto")
    subject: str = "schedule"


def formats() -> dict[str, ScheduleFormat]:
    """Every registered format by name, in the order `export --help` lists them."""
    from optimizer.formats import (
        chrome_trace,
        example_split,
        gantt_html,
        gantt_svg,
        layer_lists,
        megatron_layout,
        pareto_json,
        pareto_svg,
        schedule_json,
        torch_csv,
    )

    modules = (
        torch_csv,
        schedule_json,
        chrome_trace,
        gantt_svg,
        gantt_html,
        pareto_json,
        pareto_svg,
        megatron_layout,
        layer_lists,
        example_split,
    )
    return {module.FORMAT.name: module.FORMAT for module in modules}


def get_format(name: str) -> ScheduleFormat:
    known = formats()
    if name not in known:
        raise InputError(f"format: '{name}' is not one of {', '.join(known)}")
    return known[name]


def missing_split(format_name: str, stage: int) -> InputError:
    """The error of a layer-split format given a schedule without one (stage `stage` lists
    no layers), the same for every such format, with the way to get a split."""
    return InputError(
        f"format: {format_name} needs the layer split; stage {stage} lists no layers "
        "(solve a layers file, `pipesched solve layers.json ...`, to get one)"
    )
