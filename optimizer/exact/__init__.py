"""Exact and near-exact schedules: CP-SAT and MILP models, window search, bounds, Pareto curves.

`solve(problem, method, options, on_progress)` is the entry point; `pareto` sweeps memory
limits. Names are loaded on first use so that importing this package stays cheap (and
does not load OR-Tools in processes that only need part of it).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "solve": "optimizer.exact.api",
    "METHODS": "optimizer.exact.api",
    "check_memory_feasible": "optimizer.schedules.listengine",
    "plot_pareto": "optimizer.formats.pareto_svg",
    "pareto_svg": "optimizer.formats.pareto_svg",
    "parse_limits": "optimizer.exact.frontier",
    "SolveOptions": "optimizer.exact.options",
    "Progress": "optimizer.exact.options",
    "lower_bound": "optimizer.exact.slicebounds",
    "LowerBound": "optimizer.exact.bounds",
    "pareto": "optimizer.exact.frontier",
    "ParetoCurve": "optimizer.exact.frontier",
    "NoScheduleFoundError": "optimizer.exact.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'optimizer.exact' has no attribute {name!r}")
