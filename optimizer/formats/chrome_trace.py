"""Chrome/Perfetto trace (Trace Event Format): one track per device, memory as counters.

Opens in chrome://tracing and ui.perfetto.dev; the problem's time unit is read as
milliseconds. Its suffix is `.trace.json`: a plain `.json` is a schedule JSON.
"""

from __future__ import annotations

import json

from optimizer.formats import ScheduleFormat
from optimizer.ops import VOCAB_KINDS, op_label
from optimizer.schedule import Schedule, memory_curve


def chrome_trace(schedule: Schedule) -> dict:
    """Trace Event Format: one thread per device, one complete event per op, memory counters."""
    microseconds = 1000.0  # the problem's unit read as milliseconds
    tables = schedule.problem.tables()
    slices = schedule.problem.num_slices
    events: list[dict] = []
    for d, device in enumerate(schedule.devices):
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": d, "args": {"name": f"device {d}"}})
        for op in device:
            events.append(
                {
                    "name": f"{op.kind}{op.stage} mb{op_label(op, slices)}",
                    "cat": op.kind,
                    "ph": "X",
                    "pid": 0,
                    "tid": d,
                    "ts": op.start * microseconds,
                    "dur": (op.end - op.start) * microseconds,
                    "args": {
                        "shard" if op.kind in VOCAB_KINDS else "stage": op.stage,
                        "microbatch": op.microbatch,
                        **({"slice": op.slice} if slices > 1 else {}),
                    },
                }
            )
        for time, usage in memory_curve(tables, device):
            events.append({"ph": "C", "name": f"memory device {d}", "pid": 0, "ts": time * microseconds, "args": {"usage": usage}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": {"method": schedule.method}}


def write(schedule: Schedule) -> str:
    return json.dumps(chrome_trace(schedule)) + "\n"


FORMAT = ScheduleFormat("chrome-trace", "Chrome/Perfetto trace: one track per device, memory as counters", ".trace.json", write)
