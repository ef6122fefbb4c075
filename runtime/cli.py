"""The `pipesched` console entry: the optimizer's commands plus `run` and `profile`.

torch is imported inside the runtime commands only, so the optimizer's commands and
`--help` stay fast.
"""

from __future__ import annotations

from optimizer.cli import app


def main() -> None:
    app()
