"""The benchmark scripts' command lines answer bad input as pipesched's commands do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("script", "args", "says"),
    [
        # refused by the solver (an InputError): a traceback before
        (
            "solver.py",
            ["--time-limit", "0", "--only", "p4-m8-uniform-linear-memvmin"],
            "error: time_limit: must be a number of seconds above 0 and at most 1e+06, got 0.0",
        ),
        ("simulate.py", ["--devices", "0"], "error: problem: num_devices"),
        # refused by the option's type: a ValueError traceback before
        ("builtins.py", ["--time-limits", "abc"], "argument --time-limits: not a number of seconds: 'abc'"),
        ("solver.py", ["--time-limits", "5,-1"], "argument --time-limits: must be a finite number of seconds above 0, got -1"),
        ("below_p.py", ["--time-limits", "nan"], "argument --time-limits: must be a finite number of seconds above 0, got nan"),
        ("jitter.py", ["--cvs", "0.1,2"], "argument --cvs: a coefficient of variation must be above 0 and at most 1, got 2"),
        ("jitter.py", ["--cvs", "nan"], "argument --cvs: a coefficient of variation must be above 0 and at most 1, got nan"),
        ("jitter.py", ["--samples", "0"], "error: --samples: must be between 1 and 10000, got 0"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(tmp_path, script, args, says):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args, "--output", str(tmp_path / "out.json")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert says in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out.json").exists()
