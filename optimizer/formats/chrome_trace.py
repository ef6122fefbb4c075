"""Chrome/Perfetto trace (built in optimizer/render.py), as an export format."""

from __future__ import annotations

import json

from optimizer.formats import ScheduleFormat
from optimizer.schedule import Schedule


def write(schedule: Schedule) -> str:
    from optimizer.render import chrome_trace

    return json.dumps(chrome_trace(schedule)) + "\n"


FORMAT = ScheduleFormat("chrome-trace", "Chrome/Perfetto trace: one track per device, memory as counters", ".json", write)
