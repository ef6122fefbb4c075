"""Gantt chart with memory curves as SVG: one row of bars per device, then each device's memory.

The SVG is written by hand (no plotting library) so that it stays small, exact and
readable in a browser: idle time is left blank, a second chunk on the same device
(interleaved, V-shape) is drawn lighter, and each memory curve has its limit dashed.
"""

from __future__ import annotations

import html
import math

from optimizer.formats import ScheduleFormat
from optimizer.io import printable
from optimizer.ops import VOCAB_KINDS, op_label
from optimizer.schedule import Schedule, memory_curve

COLOURS = {"F": "#4c78a8", "B": "#59a14f", "W": "#f28e2b", "BW": "#9c6ade", "S": "#e15759", "T": "#b07aa1"}
# A second chunk on the same device (interleaved, V-shape) is drawn lighter.
LIGHT_COLOURS = {"F": "#9ecae9", "B": "#a6d99b", "W": "#ffbf79", "BW": "#cdb4ee"}

_WIDTH = 1100
_LEFT = 80
_ROW = 26
_MEM_ROW = 60
_GAP = 30


def _x(time: float, start: float, span: float) -> float:
    return _LEFT + (time - start) / span * (_WIDTH - _LEFT - 10)


def gantt_svg(schedule: Schedule) -> str:
    """The Gantt chart and per-device memory curves as one SVG document."""
    problem = schedule.problem
    tables = problem.tables()
    ops = [op for device in schedule.devices for op in device]
    start = min((op.start for op in ops), default=0.0)
    # Scaled to the schedule whatever its unit (times of 1e-300 are drawn as any others).
    span = schedule.metrics.makespan if schedule.metrics.makespan > 0 else 1.0
    p = problem.num_devices
    gantt_height = p * _ROW
    memory_top = 40 + gantt_height + _GAP
    height = memory_top + p * (_MEM_ROW + 8) + 30
    first_stage = {d: min(problem.stages_on(d)) for d in range(p)}
    slices = problem.num_slices  # with token slices, ops are labelled mb.slice

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{_LEFT}" y="16" font-size="13">{html.escape(title(schedule))}</text>',
    ]
    legend_x = _LEFT
    for kind, colour in COLOURS.items():
        if kind in VOCAB_KINDS and problem.vocab_parallel is None:
            continue
        parts.append(f'<rect x="{legend_x}" y="22" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{legend_x + 14}" y="31">{kind}</text>')
        legend_x += 44
    chunks = "lighter: later chunk on the device; " if problem.num_stages > p else ""  # one stage a device: no later chunk
    parts.append(f'<text x="{legend_x}" y="31" fill="#555">{chunks}blank: idle</text>')

    for d, device in enumerate(schedule.devices):
        y = 40 + d * _ROW
        parts.append(f'<text x="4" y="{y + _ROW / 2 + 4}">device {d}</text>')
        parts.append(f'<rect x="{_LEFT}" y="{y}" width="{_WIDTH - _LEFT - 10}" height="{_ROW - 4}" fill="#f3f3f3"/>')
        for op in device:
            x0, x1 = _x(op.start, start, span), _x(op.end, start, span)
            vocab = op.kind in VOCAB_KINDS  # a shard's pass: its `stage` is the shard
            palette = COLOURS if vocab or op.stage == first_stage[d] else LIGHT_COLOURS
            label = op_label(op, slices)
            tip = f"{op.kind} {'shard' if vocab else 'stage'} {op.stage} mb {label}: {op.start:.6g} to {op.end:.6g}"
            parts.append(
                f'<rect x="{x0:.2f}" y="{y}" width="{max(x1 - x0, 0.5):.2f}" height="{_ROW - 4}" '
                f'fill="{palette[op.kind]}" stroke="white" stroke-width="0.5"><title>{tip}</title></rect>'
            )
            if x1 - x0 >= max(12, 6 * len(label)):  # about 6 px per character at font size 10
                parts.append(
                    f'<text x="{(x0 + x1) / 2:.2f}" y="{y + _ROW / 2 + 2}" text-anchor="middle" fill="white" font-size="10">{label}</text>'
                )

    parts.append(f'<text x="{_LEFT}" y="{memory_top - 8}" font-size="12">memory per device (dashed: limit)</text>')
    for d, device in enumerate(schedule.devices):
        top = memory_top + d * (_MEM_ROW + 8)
        limit = tables.limit[d]
        curve = memory_curve(tables, device)
        peak = max((usage for _, usage in curve), default=0.0)
        scale_max = max(peak, limit if math.isfinite(limit) else 0.0) or 1.0
        parts.append(f'<text x="4" y="{top + _MEM_ROW / 2}">device {d}</text>')
        parts.append(f'<text x="4" y="{top + _MEM_ROW / 2 + 13}" fill="#555">peak {peak:.4g}</text>')
        parts.append(f'<rect x="{_LEFT}" y="{top}" width="{_WIDTH - _LEFT - 10}" height="{_MEM_ROW}" fill="#fafafa" stroke="#ddd"/>')
        points, previous = [], 0.0
        for time, usage in curve:
            x = _x(time, start, span)
            points.append(f"{x:.2f},{top + _MEM_ROW - previous / scale_max * _MEM_ROW:.2f}")
            points.append(f"{x:.2f},{top + _MEM_ROW - usage / scale_max * _MEM_ROW:.2f}")
            previous = usage
        points.append(f"{_x(start + span, start, span):.2f},{top + _MEM_ROW - previous / scale_max * _MEM_ROW:.2f}")
        parts.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="#333" stroke-width="1.2"/>')
        if math.isfinite(limit):
            y_limit = top + _MEM_ROW - limit / scale_max * _MEM_ROW
            parts.append(
                f'<line x1="{_LEFT}" x2="{_WIDTH - 10}" y1="{y_limit:.2f}" y2="{y_limit:.2f}" stroke="#d62728" stroke-dasharray="5,3"/>'
            )
    axis_y = height - 12
    for tick in range(6):
        time = start + span * tick / 5
        parts.append(f'<text x="{_x(time, start, span):.2f}" y="{axis_y}" text-anchor="middle" fill="#555">{time:.4g}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def title(schedule: Schedule) -> str:
    m = schedule.metrics
    # The method is read from a file: a control character in it would make the SVG
    # ill-formed XML (and reach a terminal), so it is escaped as on the command line.
    text = f"{printable(schedule.method)}: makespan {m.makespan:.6g}, bubble {m.bubble_ratio:.1%}, peak memory {max(m.peak_memory, default=0):.4g}"
    if m.lower_bound is not None and m.gap is not None:
        text += f", lower bound {m.lower_bound:.6g} (gap {m.gap:.2%})"
    return text


FORMAT = ScheduleFormat("svg", "Gantt chart and memory curves, SVG", ".svg", gantt_svg)
