"""A memory-against-speed curve drawn with matplotlib as SVG: bubble and makespan against memory.

The solver's curve (with its lower bounds) beside the known schedules at their peak
memory; limits where nothing fits are shaded. Needs the `plot` extra (matplotlib).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from optimizer.errors import InputError
from optimizer.formats import ScheduleFormat

if TYPE_CHECKING:
    from optimizer.exact.frontier import ParetoCurve


def plot_pareto(curve: ParetoCurve, path: str | Path) -> None:
    """An SVG with two panels: bubble and makespan against memory, solver curve and known schedules."""
    from optimizer.io import write_text_atomic

    if Path(path).suffix.lower() != ".svg":  # the text is SVG whatever the name says
        raise InputError(f"plot: {path} does not end in .svg; the plot is an SVG")
    write_text_atomic(path, pareto_svg(curve))


def pareto_svg(curve: ParetoCurve) -> str:
    """The text of `plot_pareto`'s SVG."""
    from io import StringIO

    import matplotlib.pyplot as plt

    figure = pareto_figure(curve)
    buffer = StringIO()
    # The same curve gives the same file: no date in the metadata, and the element ids
    # matplotlib draws from a hash salted with a fixed string instead of a random one.
    with plt.rc_context({"svg.hashsalt": "pipesched"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(figure)
    return buffer.getvalue()


def require_matplotlib(option: str) -> None:
    """One line naming the extra to install when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise InputError(f"{option}: needs matplotlib ({error}); install it with pip install 'pipesched[plot]'") from None


def _x(limit: float | list[float]) -> float:
    """Where a limit sits on the memory axis: a per-device list at its largest value."""
    return max(limit) if isinstance(limit, list) else limit


def pareto_figure(curve: ParetoCurve):
    """The matplotlib figure of `plot_pareto` (Agg backend, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    solved = [p for p in curve.points if p.feasible]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for axis, metric, label in ((left, "bubble", "bubble rate"), (right, "makespan", "makespan")):
        if solved:
            axis.step(
                [_x(p.limit) for p in solved],
                [getattr(p, metric) for p in solved],
                where="post",
                marker="o",
                color="tab:blue",
                label="pipesched auto",
            )
        if metric == "makespan" and solved:
            axis.plot([_x(p.limit) for p in solved], [p.bound for p in solved], ls="--", color="tab:gray", label="lower bound")
        for g in curve.generators:
            axis.scatter([g.peak_memory], [getattr(g, metric)], marker="s", color="tab:orange", zorder=3)
            axis.annotate(g.name, (g.peak_memory, getattr(g, metric)), textcoords="offset points", xytext=(4, 4), fontsize=8)
        # Only proven infeasibility is shaded: a limit where nothing was found in time
        # ("unknown") may still have a schedule.
        # (a per-device limit has no one place on the axis where nothing fits: not shaded)
        infeasible = [p.limit for p in curve.points if not p.feasible and p.status == "infeasible" and not isinstance(p.limit, list)]
        if infeasible:
            first_fit = min((_x(p.limit) for p in solved if _x(p.limit) > max(infeasible)), default=max(infeasible))
            axis.axvspan(min(infeasible), first_fit, color="tab:red", alpha=0.08, label="no schedule fits")
        axis.set_xlabel("memory limit / peak memory")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    for axis in (left, right):
        if axis.get_legend_handles_labels()[0]:  # a legend of nothing warns (Ctrl-C before any limit)
            axis.legend(fontsize=8)
    figure.suptitle(f"Memory against speed ({curve.time_limit:g} s per point); squares: known schedules at their peak memory")
    figure.tight_layout()
    return figure


FORMAT = ScheduleFormat("pareto-svg", "memory-against-speed curve, SVG plot (needs matplotlib)", ".svg", pareto_svg, subject="pareto")
