"""Shared fixtures; the problem factories and hypothesis strategies live in tests/factories.py.

Markers (registered in pyproject.toml): `solver` for tests that run CP-SAT or MILP models,
`runtime` for tests that start torch.distributed ranks, `slow` for tests of about two seconds
or more (on 2 cores). `make test-fast` runs everything not marked slow.
"""

from __future__ import annotations

import random
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Test helpers (factories, exact_brute_force) are imported by module name from here.
sys.path.insert(0, str(Path(__file__).parent))

from factories import random_problem


@pytest.fixture
def rng(request) -> random.Random:
    """A random generator seeded by the test's name: reproducible, different per test."""
    return random.Random(request.node.nodeid)


@pytest.fixture
def make_problem(rng):
    """random_problem bound to the test's generator: make_problem(p, m, placement, limit=...)."""
    return lambda p, m, placement="linear", **options: random_problem(rng, p, m, placement, **options)


@pytest.fixture
def record_calls(monkeypatch):
    """record_calls(owner, name, note, into=None): owner.name becomes a pass-through that
    first appends note(*its arguments) to a list, which it returns (`into`: a list shared
    by several, so that their calls keep their order). Undone after the test."""

    def install(owner: object, name: str, note: Callable[..., object], into: list | None = None) -> list:
        calls = [] if into is None else into
        real = getattr(owner, name)

        def recorded(*args, **kwargs):
            calls.append(note(*args, **kwargs))
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, recorded)
        return calls

    return install


@pytest.fixture
def python_ctrl_c() -> Iterator[None]:
    """Python's own Ctrl-C handler during the test, as in a terminal; the previous one after.

    A runner started in the background of a non-interactive shell, or a parallel test
    worker, has SIGINT ignored: a test that sends itself Ctrl-C needs the handler a user has.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
