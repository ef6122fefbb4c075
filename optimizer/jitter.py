"""How a schedule holds up when op times vary: its order re-timed under random op times.

A schedule runs as an order: the executor starts each op as soon as its inputs and its
device allow, so when the real op times differ from the profiled ones the order stays
and the times shift. A schedule tuned to exact times (every wait filled) may lose more
of its lead to such variation than a looser one. This module measures that.

Each sample draws one factor per op, lognormal with mean 1 and coefficient of variation
`cv` (kernel times are positive and skewed to the slow side), multiplies the op's
duration by it and times every order as soon as possible (optimizer.simulate); transfers
and vocabulary barriers keep their times. Every schedule compared sees the same factors
in a sample (an op is the same op, by kind, stage, microbatch and slice, in every
schedule, and its factor does not depend on which schedules are compared), so the
differences between schedules are not sampling noise. The factors
come from a seeded generator: the same seed, samples and schedules give the same
figures on every machine (numpy's PCG64 stream).

The makespan of a fixed order is its longest path (dependencies and each device's
order), a convex function of the durations, so its mean over mean-one factors is at
least the nominal makespan (Jensen); how much more depends on how many paths are near
critical. Memory does not change: a device's peak depends on its order alone. Each op
varies on its own: a fused backward is one op with one factor, where a split backward's B
and W get one each, so the sum B + W varies less than a fused backward of the same time
(independent parts partly cancel) and fused schedules come out more variable than split
ones. That is this model's assumption (independent op times), not sampling luck.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from optimizer.errors import InputError
from optimizer.ops import Kind, Op
from optimizer.problem import Problem
from optimizer.schedule import Schedule, makespan_of
from optimizer.simulate import simulate_times

# Ops timed in one comparison (samples x schedules x ops per schedule): about 4 us an op
# on this machine (9 schedules of 49,152 ops, 5 samples: 8.6 s), so about 20 s; more is
# refused before any is timed, naming the samples that fit.
MAX_TIMED_OPS = 5_000_000
MAX_SAMPLES = 10_000
MAX_CV = 1.0


@dataclass(frozen=True)
class JitterSummary:
    """A schedule's makespan over the samples, beside its nominal one."""

    nominal: float
    mean: float
    p50: float
    p95: float
    worst: float

    def as_dict(self) -> dict[str, float]:
        return {"nominal": self.nominal, "mean": self.mean, "p50": self.p50, "p95": self.p95, "max": self.worst}


def lognormal_factors(count: int, cv: float, rng: np.random.Generator) -> np.ndarray:
    """`count` positive factors of mean 1 and coefficient of variation `cv`."""
    sigma2 = math.log1p(cv * cv)
    return rng.lognormal(mean=-sigma2 / 2, sigma=math.sqrt(sigma2), size=count)


def check_jitter_request(cv: float, samples: int, schedules: int, ops: int) -> None:
    """Refuse a coefficient of variation or sample count out of range, or more timing
    than MAX_TIMED_OPS (naming the most samples that fit)."""
    if not (math.isfinite(cv) and 0 < cv <= MAX_CV):
        raise InputError(f"--jitter: the coefficient of variation must be above 0 and at most {MAX_CV:g}, got {cv:.12g}")
    if not 1 <= samples <= MAX_SAMPLES:
        raise InputError(f"--samples: must be between 1 and {MAX_SAMPLES}, got {samples}")
    timed = samples * schedules * ops
    if timed > MAX_TIMED_OPS:
        most = MAX_TIMED_OPS // max(1, schedules * ops)
        fits = f"at most {most} here" if most >= 1 else "none fit here; compare fewer schedules"
        raise InputError(
            f"--samples: {samples} samples x {schedules} schedules x {ops} ops = {timed} ops to time is more than "
            f"the {MAX_TIMED_OPS} pipesched times in one comparison ({fits})"
        )


def jittered_makespans(problem: Problem, schedules: Sequence[Schedule], cv: float, samples: int, seed: int) -> list[list[float]]:
    """Per schedule, its as-soon-as-possible makespan in each sample (see the module doc)."""
    orders = [schedule.order() for schedule in schedules]
    keys = every_op(problem)
    rng = np.random.default_rng(seed % 2**32)
    results: list[list[float]] = [[] for _ in schedules]
    for _ in range(samples):
        factors = dict(zip(keys, lognormal_factors(len(keys), cv, rng).tolist(), strict=True))
        for n, order in enumerate(orders):
            timed = simulate_times(problem, order, factors=factors)
            results[n].append(makespan_of(timed))
    return results


def summarize(nominal: float, makespans: Sequence[float]) -> JitterSummary:
    """Mean, median, 95th percentile (linear interpolation) and largest makespan."""
    values = np.asarray(makespans, dtype=float)
    return JitterSummary(
        nominal=nominal,
        mean=float(values.mean()),
        p50=float(np.percentile(values, 50)),
        p95=float(np.percentile(values, 95)),
        worst=float(values.max()),
    )


def every_op(problem: Problem) -> list[Op]:
    """Every op any schedule of `problem` may hold, in a fixed order: an op's factor in a
    sample then depends on the seed and the problem only, not on which schedules are
    compared (a fused backward and its B and W are different ops)."""
    m, k = problem.num_microbatches, problem.num_slices
    ops = [
        Op(kind, s, i, j)
        for kind in (Kind.F, Kind.B, Kind.W, Kind.BW)
        for s in range(problem.num_stages)
        for i in range(m)
        for j in range(k)
    ]
    if problem.vocab_parallel is not None:
        ops += [Op(kind, d, i, 0) for kind in (Kind.S, Kind.T) for d in range(problem.num_devices) for i in range(m)]
    return ops
