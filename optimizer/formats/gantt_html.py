"""Gantt chart with memory curves as an HTML page (optimizer/render.py), as an export format."""

from __future__ import annotations

from optimizer.formats import ScheduleFormat
from optimizer.schedule import Schedule


def write(schedule: Schedule) -> str:
    from optimizer.render import gantt_html

    return gantt_html(schedule)


FORMAT = ScheduleFormat("html", "Gantt chart and memory curves, HTML page", ".html", write)
