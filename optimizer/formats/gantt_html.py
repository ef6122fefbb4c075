"""The SVG Gantt chart (optimizer/formats/gantt_svg.py) in an HTML page, titled with the metrics."""

from __future__ import annotations

import html

from optimizer.formats import ScheduleFormat
from optimizer.formats.gantt_svg import gantt_svg, title
from optimizer.schedule import Schedule


def gantt_html(schedule: Schedule) -> str:
    return (
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title(schedule))}</title></head>\n<body>\n{gantt_svg(schedule)}</body></html>\n"
    )


FORMAT = ScheduleFormat("html", "Gantt chart and memory curves, HTML page", ".html", gantt_html)
