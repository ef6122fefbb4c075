"""`pipesched solve layers.json`: the split search from the command line, and its report.

Checks the layers-only options, runs optimizer.balance.choose_split with the solver,
prints each split tried on stderr as it is scored, then the chosen split beside the
even split and the hand rules (iteration time, bubble, per-device peak memory with the
layers' fixed memory included).
"""

from __future__ import annotations

import json
import sys
from typing import cast

from rich.table import Table

from optimizer.balance import BalanceResult, SplitTrial, check_layers_fit, choose_split, choose_vocab_split
from optimizer.errors import InputError
from optimizer.exact.incumbents import objective_value
from optimizer.exact.options import SolveOptions
from optimizer.layers import layers_from_json
from optimizer.problem import Problem, check_size
from optimizer.schedule import Schedule, metrics_summary
from optimizer.split import Placement
from optimizer.vocab_layers import shard_vocabulary


def solve_layers(
    data: object,
    source: str,
    devices: int | None,
    microbatches: int | None,
    placement_name: str,
    memory_limit: float | None,
    method: str,
    options: SolveOptions,
    as_json: bool,
    quiet: bool,
    vocab_barriers: tuple[int, ...] = (),
) -> tuple[Schedule, bool]:
    """Choose the split and the schedule; return the schedule and whether Ctrl-C cut the search.

    `vocab_barriers`: with vocabulary parallelism, the barrier counts to try (empty: none).
    """
    if devices is None or microbatches is None:
        raise InputError(f"{source}: a layers file needs --devices and --microbatches")
    if method != "auto":
        raise InputError(f"method: a layers file is solved with auto (the split is chosen with the schedule), not '{method}'")
    try:
        check_size(devices, None, microbatches)
    except ValueError as error:
        raise InputError(str(error)) from None
    profile = layers_from_json(data, source)
    placement = Placement.named(placement_name, devices)
    if vocab_barriers:  # only the blocks (the trunk) fill the stages
        check_layers_fit(shard_vocabulary(profile, devices, vocab_barriers[0])[0], placement, "blocks (embedding and head sharded)")
    else:
        check_layers_fit(profile, placement)

    def report(trial: SplitTrial) -> None:
        # A live progress display, like the solver's: on a terminal only, so that an error
        # stays the one line on stderr when output is captured.
        if not quiet and sys.stderr.isatty():
            value = "does not fit" if trial.schedule is None else f"{objective_value(trial.schedule, options.objective):.6g}"
            print(f"split {trial.name} {_text(trial.split)}: {value}", file=sys.stderr)

    from optimizer.exact import solve

    def solve_split(problem: Problem, split_options: SolveOptions) -> Schedule:
        return solve(problem, "auto", split_options)

    if vocab_barriers:
        result = choose_vocab_split(profile, placement, microbatches, memory_limit, options, solve_split, vocab_barriers, on_trial=report)
    else:
        result = choose_split(profile, placement, microbatches, memory_limit, options, solve_split, on_trial=report)
    assert result.chosen.schedule is not None
    if result.interrupted:
        # As for a problem file: the report that follows is of a cut search.
        print("interrupted: writing the best split and schedule found so far", file=sys.stderr)
    if as_json:
        print(json.dumps(_as_json(result, options.objective)))
    else:
        _print_table(result, options.objective)
    return result.chosen.schedule, result.interrupted


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _text(split: tuple[int, ...]) -> str:
    return "/".join(map(str, split))


def _peak(trial: SplitTrial) -> float | None:
    if trial.schedule is None or trial.held is None:
        return None
    return max(peak + held for peak, held in zip(trial.schedule.metrics.peak_memory, trial.held))


def _shown(result: BalanceResult) -> list[SplitTrial]:
    """The named splits (even, hand rules, bottleneck) and the chosen one; not every search step."""
    shown = [t for t in result.trials if not t.name.startswith("search")]
    if result.chosen not in shown:
        shown.append(result.chosen)
    return shown


def _as_json(result: BalanceResult, objective: str) -> dict:
    rows = []
    for trial in _shown(result):
        rows.append(
            {
                "split": trial.name,
                "layers_per_stage": list(trial.split),
                objective: None if trial.schedule is None else objective_value(trial.schedule, objective),
                "peak_memory": _peak(trial),
                "note": trial.reason,
                "chosen": trial is result.chosen,
            }
        )
    schedule = cast("Schedule", result.chosen.schedule)
    vocab = None if result.vocab is None else result.vocab.passes.model_dump()
    return {"metrics": metrics_summary(schedule), "splits": rows, "splits_tried": len(result.trials), "vocab_parallel": vocab}


def _note(trial: SplitTrial) -> str:
    if trial.need is not None:
        return f"needs a limit of {trial.need:.4g}"
    return trial.reason or ""


def _print_table(result: BalanceResult, objective: str) -> None:
    from optimizer.cli import metrics_line, stdout_console

    table = Table(title=f"layer splits ({len(result.trials)} tried)")
    for column in ("split", "layers per stage", objective, "peak memory with parameters", "note"):
        table.add_column(column, no_wrap=column == "layers per stage")
    for trial in _shown(result):
        peak = _peak(trial)
        table.add_row(
            trial.name,
            _text(trial.split),
            "-" if trial.schedule is None else f"{objective_value(trial.schedule, objective):.6g}",
            "-" if peak is None else f"{peak:.4g}",
            "chosen" if trial is result.chosen else _note(trial),
        )
    stdout_console().print(table)
    schedule = cast("Schedule", result.chosen.schedule)
    # The schedule's own peak counts activations; the table's column adds the parameters.
    line = metrics_line(schedule, peak_label="peak activation memory")
    peak = _peak(result.chosen)
    with_parameters = "" if peak is None else f" (peak memory with parameters {peak:.4g})"
    print(f"chosen split {_text(result.chosen.split)}: {line}{with_parameters}")
    if result.vocab is not None:
        passes = result.vocab.passes
        print(
            f"vocabulary parallelism: embedding and head sharded over {_count(schedule.problem.num_devices, 'device')}, "
            f"{_count(passes.barriers, 'barrier')} per microbatch (S {passes.forward:.4g}, T {passes.backward:.4g})"
        )
