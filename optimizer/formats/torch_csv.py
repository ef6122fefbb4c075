"""torch.distributed.pipelining's schedule CSV: one row per rank, one action per cell.

A cell is `{stage}{kind}{microbatch}`: F forward, I input gradient (our B), W weight
gradient, B fused backward (our BW); a blank cell is no action; `(a;b)OVERLAP_F_B` runs
two actions as one slot (DualPipe's overlapped forward and backward). Row r is rank r,
and the stage-to-rank mapping is wherever a stage's actions appear, so any placement
(linear, interleaved, V, or hand-made) is kept as it is.

The CSV holds the order only: times, transfer cost and memory stay in the problem, which
is why importing one needs a problem. Reading follows torch's `compute_only` format:
communication and sharding actions (SEND_F, RECV_B, UNSHARD, REDUCE_GRAD, ...) are
inserted by torch's runtime itself and are skipped here; the two halves of an
OVERLAP_F_B pair become two ops that run back to back, in the pair's order.

This module only reads and writes text: it does not need torch.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

from optimizer.errors import InputError
from optimizer.formats import ScheduleFormat
from optimizer.io import printable
from optimizer.ops import Op
from optimizer.problem import Problem
from optimizer.schedule import Schedule
from optimizer.validate import checked_schedule

NAME = "torch-csv"

# Our op kind -> torch's action letter, and back.
TORCH_LETTER = {"F": "F", "B": "I", "W": "W", "BW": "B"}
OUR_KIND = {letter: kind for kind, letter in TORCH_LETTER.items()}

# Actions torch's runtime adds itself when it lowers a compute-only schedule.
_SKIPPED_KINDS = ("UNSHARD", "RESHARD", "REDUCE_GRAD", "SEND_F", "RECV_F", "SEND_B", "RECV_B")
# ASCII digits only: torch writes them, and \d would also take Arabic-Indic or full-width ones.
_ACTION = re.compile(r"^([0-9]+)(F|I|W|B|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)([0-9]*)$")
_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")
# No problem has a stage or microbatch this long; longer numbers are refused before int().
MAX_DIGITS = 9
# Actions a CSV may hold per op of its problem: the op and torch's sends and receives
# around it (at most four), with room to spare.
CELLS_PER_OP = 6


def action_text(op: Op) -> str:
    return f"{op.stage}{TORCH_LETTER[op.kind]}{op.microbatch}"


def unexpressed(problem: Problem) -> str | None:
    """What of the problem torch's actions cannot name (they name a stage and a microbatch
    only), or None."""
    if problem.vocab_parallel is not None:
        return "vocabulary passes (S, T)"
    if problem.num_slices > 1:
        return f"{problem.num_slices} token slices per microbatch"
    return None


def losses_out_of_order(orders: list[list[Op]], num_stages: int) -> str | None:
    """Where the last stage runs a forward before an earlier microbatch's, or None.

    torch's runtime keeps the last stage's losses in the order its forwards ran and hands
    the backward of microbatch i the i-th: out of order, it trains on the wrong losses
    (and exits 0) or stops at a loss not yet computed. pipesched's own engine keys them by
    microbatch, and every family and solver keeps each stage's forwards in order."""
    last = num_stages - 1
    forwards = [op.microbatch for device in orders for op in device if op.kind == "F" and op.stage == last]
    for earlier, later in zip(forwards, forwards[1:]):
        if later < earlier:
            return f"F(stage {last}, mb {earlier}) before F(stage {last}, mb {later})"
    return None


def torch_cannot_run(schedule: Schedule) -> str | None:
    """Why torch's runtime cannot run the schedule as it is ("has 4 token slices per
    microbatch", "runs F(...) before F(...), ..."), or None."""
    missing = unexpressed(schedule.problem)
    if missing is not None:
        return f"has {missing}, which torch's actions cannot name"
    swapped = losses_out_of_order(schedule.order(), schedule.problem.num_stages)
    if swapped is not None:
        return f"runs {swapped}: torch's runtime pairs the last stage's losses with its forwards in the order they run"
    return None


def export_rows(schedule: Schedule) -> list[list[str]]:
    """One row of torch actions per device, in the schedule's order."""
    reason = torch_cannot_run(schedule)
    if reason is not None:
        raise InputError(f"format: {NAME}: this schedule {reason}; run it with pipesched run (its own engine)")
    return [[action_text(op) for op in device] for device in schedule.order()]


def export_csv(schedule: Schedule) -> str:
    """The schedule as torch's compute-only CSV text (see the module docstring)."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(export_rows(schedule))
    return buffer.getvalue()


def torchtitan_layout(problem: Problem) -> str | None:
    """The torchtitan stage layout this placement matches ("loop" or "v"), or None.

    torch's runtime takes any placement from the CSV, but torchtitan builds each rank's
    stages itself, either looped (stage s on rank s mod p) or V-shaped.
    """
    p, devices = problem.num_devices, [stage.device for stage in problem.stages]
    if problem.num_stages % p == 0 and devices == [s % p for s in range(problem.num_stages)]:
        return "loop"
    if problem.num_stages == 2 * p and devices == [s if s < p else 2 * p - 1 - s for s in range(2 * p)]:
        return "v"
    return None


@dataclass(frozen=True)
class ImportedOrder:
    """Per-device op orders read from a CSV, and how many OVERLAP_F_B pairs were split."""

    orders: list[list[Op]]
    overlapped_pairs: int
    skipped_actions: int


def parse_cell(text: str, where: str) -> tuple[list[Op], bool, int]:
    """A cell's compute ops (in order), whether it was an overlapped pair, and how many
    communication or sharding actions it held (skipped)."""
    text = text.strip()
    if not text:
        return [], False, 0
    overlap = _OVERLAP.match(text)
    parts = [part.strip() for part in overlap.group(1).split(";")] if overlap else [text]
    if "" in parts:
        raise InputError(f"{where}: '{printable(text)}' has an empty action in its overlapped pair")
    ops: list[Op] = []
    skipped = 0
    for part in parts:
        match = _ACTION.match(part)
        if match is None:
            raise InputError(f"{where}: '{printable(text)}' is not a torch action like 2F0, 2I0, 2W0, 2B0 or (0F7;7B3)OVERLAP_F_B")
        stage, letter, microbatch = match.groups()
        if letter in _SKIPPED_KINDS:
            skipped += 1
            continue
        if not microbatch:
            raise InputError(f"{where}: '{printable(part)}' has no microbatch number")
        if max(len(stage), len(microbatch)) > MAX_DIGITS:
            raise InputError(f"{where}: '{printable(part)}' has a stage or microbatch number longer than {MAX_DIGITS} digits")
        ops.append(Op(OUR_KIND[letter], int(stage), int(microbatch)))
    return ops, overlap is not None, skipped


def parse_csv(text: str, problem: Problem, source: str = "schedule.csv") -> ImportedOrder:
    """Per-device orders from torch CSV text, checked against the problem's placement.

    Refuses (InputError) a CSV with another number of ranks, an unknown action, a stage
    or microbatch the problem does not have, or a stage on another rank than the problem
    places it.
    """
    if problem.num_slices > 1:
        raise InputError(f"{source}: {NAME} has no token slices; the problem has {problem.num_slices} per microbatch")
    if problem.vocab_parallel is not None:
        raise InputError(f"{source}: {NAME} has no vocabulary passes (S, T); the problem has vocab_parallel")
    # A byte order mark, as spreadsheet programs write at the start of a UTF-8 CSV (JSON
    # files with one are read too).
    text = text.removeprefix("\ufeff")
    # A rank's row holds its compute actions and torch's communication actions around
    # them (a few per op); a CSV with many more cells than that is refused before parsing.
    cells = text.count(",") + text.count(";") + text.count("\n") + 1
    most = CELLS_PER_OP * problem.num_ops + problem.num_devices
    if cells > most:
        raise InputError(
            f"{source}: {cells} cells is more than a schedule of this problem holds ({problem.num_ops} ops, at most {CELLS_PER_OP} actions each)"
        )
    try:
        # Universal newlines: a CSV saved with old Mac line ends (a bare CR) reads as rows too.
        rows = list(csv.reader(io.StringIO(text, newline=None)))
    except csv.Error as exc:
        raise InputError(f"{source}: not a CSV file ({exc})") from None
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()  # a trailing blank line is not a rank
    if not _any_action(rows):
        # A problem or schedule JSON given for the CSV, say: its lines are no ranks.
        looks = " (it reads as JSON)" if text.lstrip()[:1] in ("{", "[") else ""
        raise InputError(f"{source}: not a torch schedule CSV{looks}: no cell holds an action such as 0F0 (stage 0, forward, microbatch 0)")
    if len(rows) != problem.num_devices:
        raise InputError(f"{source}: {len(rows)} rows (ranks), the problem has {problem.num_devices} devices")
    orders: list[list[Op]] = []
    overlapped = skipped = 0
    for rank, row in enumerate(rows):
        ops: list[Op] = []
        for column, cell in enumerate(row):
            where = f"{source}: row {rank + 1}, column {column + 1}"
            cell_ops, was_pair, cell_skipped = parse_cell(cell, where)
            overlapped += was_pair
            skipped += cell_skipped
            for op in cell_ops:
                _check_op(op, rank, problem, where)
            ops += cell_ops
        orders.append(ops)
    return ImportedOrder(orders, overlapped, skipped)


def _any_action(rows: list[list[str]]) -> bool:
    """Whether any cell holds a torch action (or an empty schedule: no cell at all)."""
    cells = [cell.strip() for row in rows for cell in row if cell.strip()]
    return not cells or any(_ACTION.match(cell) or _OVERLAP.match(cell) for cell in cells)


def _check_op(op: Op, rank: int, problem: Problem, where: str) -> None:
    if op.stage >= problem.num_stages:
        raise InputError(f"{where}: stage {op.stage} does not exist (the problem has {problem.num_stages} stages)")
    if op.microbatch >= problem.num_microbatches:
        raise InputError(f"{where}: microbatch {op.microbatch} does not exist (the problem has {problem.num_microbatches})")
    device = problem.stages[op.stage].device
    if device != rank:
        raise InputError(f"{where}: stage {op.stage} is on rank {rank} here, on device {device} in the problem")


def import_schedule(text: str, problem: Problem, source: str = "schedule.csv", *, memory: bool = True) -> tuple[Schedule, ImportedOrder]:
    """A timed, validated schedule from torch CSV text and the problem it runs.

    Raises DeadlockError when the order cannot finish, ScheduleError when it breaks a rule
    (with `memory`, the memory limit too; without, only the structure, as for torch's own
    orders, which know nothing of a limit).
    """
    imported = parse_csv(text, problem, source)
    return checked_schedule(problem, imported.orders, source, NAME, memory=memory), imported


FORMAT = ScheduleFormat(NAME, "torch.distributed.pipelining's per-rank action CSV (torchtitan reads it too)", ".csv", export_csv)
