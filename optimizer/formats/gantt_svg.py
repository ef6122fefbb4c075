"""Gantt chart with memory curves as SVG (drawn in optimizer/render.py), as an export format."""

from __future__ import annotations

from optimizer.formats import ScheduleFormat
from optimizer.schedule import Schedule


def write(schedule: Schedule) -> str:
    from optimizer.render import gantt_svg

    return gantt_svg(schedule)


FORMAT = ScheduleFormat("svg", "Gantt chart and memory curves, SVG", ".svg", write)
