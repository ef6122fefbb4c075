"""Window search ranks windows by their idle time (optimizer.exact.neighbourhood): the
indexed count equals a direct scan of every op (the definition)."""

from __future__ import annotations

from optimizer.exact.neighbourhood import _BusyIndex
from optimizer.ops import TimedOp


def _scan(ops: list[TimedOp], t0: int, t1: int) -> int:
    busy = sum(max(0, min(t.end, t1) - max(t.start, t0)) for t in ops if t.end > t0 and t.start < t1)
    first, last = (round(ops[0].start), round(ops[-1].end)) if ops else (0, 0)
    return max(0, round(max(0, min(t1, last) - max(t0, first)) - busy))


def test_idle_inside_a_window_equals_a_scan(rng):
    for _ in range(500):
        ops, t = [], rng.randint(0, 5)
        for k in range(rng.randint(0, 8)):
            start = t + rng.randint(0, 4)
            t = start + rng.randint(1, 5)
            ops.append(TimedOp("F", 0, k, start, t))
        t0 = rng.randint(0, 40)
        t1 = t0 + rng.randint(1, 30)
        assert _BusyIndex(ops).idle_inside(t0, t1) == _scan(ops, t0, t1)
