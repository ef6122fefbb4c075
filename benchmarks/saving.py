"""Saving a benchmark's results: the JSON and its markdown table beside it, each written
whole, and the machine's core count the tables name."""

from __future__ import annotations

import os
from pathlib import Path

from optimizer.io import write_json_atomic, write_text_atomic


def save_results(output: Path, payload: dict, table: str) -> None:
    """`payload` as JSON at `output` and `table` at the same name with .md; a run stopped
    between the two writes leaves the previous table, never half of one."""
    write_json_atomic(output, payload)
    write_text_atomic(output.with_suffix(".md"), table)


def cores() -> int:
    """The machine's core count, as the results' tables state it."""
    return os.cpu_count() or 1


def selected(name: str, only: str) -> bool:
    """Whether a case named `name` is run under `--only`: it contains one of the
    comma-separated texts (all cases when `only` is empty)."""
    return any(part in name for part in only.split(","))
