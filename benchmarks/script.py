"""What every benchmark script's command line shares: bad input answered as pipesched's
commands answer it (one line on stderr, exit 2), and the option types they parse."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

from optimizer.errors import PipeschedError


def run_main(main: Callable[[], int | None]) -> None:
    """Run a script's `main`; a PipeschedError (a bad option or problem, an infeasible
    setting) is one `error:` line and exit 2, not a traceback."""
    try:
        code = main()
    except PipeschedError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code or 0)


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds above 0, got {text}")
    return value


def seconds_list(text: str) -> list[float]:
    """An argparse type: comma-separated seconds, each above 0 ("5,60")."""
    return [positive_seconds(part.strip()) for part in text.split(",")]
