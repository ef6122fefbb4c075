"""Shared fixtures; the problem factories and hypothesis strategies live in tests/factories.py.

Markers (registered in pyproject.toml): `solver` for tests that run CP-SAT or MILP models,
`runtime` for tests that start torch.distributed ranks, `slow` for tests of more than a few
seconds. `make test-fast` runs everything not marked slow.
"""

from __future__ import annotations

import random
import sys
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
