"""Schedule JSON v1 (defined in optimizer/schedule.py), as an export format."""

from __future__ import annotations

import json

from optimizer.formats import ScheduleFormat
from optimizer.schedule import Schedule


def write(schedule: Schedule) -> str:
    return json.dumps(schedule.to_json(), indent=1) + "\n"


FORMAT = ScheduleFormat("schedule-json", "pipesched's schedule JSON, version 1", ".json", write)
