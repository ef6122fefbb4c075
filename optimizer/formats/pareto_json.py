"""A memory-against-speed curve (optimizer/exact/frontier.py) as JSON: `pipesched.pareto`, version 1.

One point per memory limit (feasible or not, with makespan, bubble, bound, gap and the
method that won) and the known schedules at the peak memory they need.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from optimizer.formats import ScheduleFormat
from optimizer.io import json_text

if TYPE_CHECKING:
    from optimizer.exact.frontier import ParetoCurve


def curve_json(curve: ParetoCurve) -> dict:
    return {
        "format": "pipesched.pareto",
        "version": 1,
        "time_limit_per_point": curve.time_limit,
        "interrupted": curve.interrupted,
        "points": [asdict(p) for p in curve.points],
        "generators": [asdict(g) for g in curve.generators],
        "problem": curve.problem,
    }


def write(curve: ParetoCurve) -> str:
    return json_text(curve_json(curve))


FORMAT = ScheduleFormat("pareto-json", "memory-against-speed curve, JSON", ".json", write, subject="pareto")
