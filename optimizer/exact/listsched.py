"""The solver's list-scheduler starting points: a few policies of the list-scheduling
engine (optimizer.schedules.listengine), quick and always feasible for any problem.

They cover the shapes of the known schedules: how many microbatches a device admits
(a multiple of its 1F1B depth, or as many as memory allows), backward or forward first,
weight gradients right after their B or only when nothing else is ready. A new
microbatch enters a device only while the device keeps room for one more microbatch's
forwards on its other stages, so devices with two chunks (V shapes) can still fill their
memory with first-chunk activations. The engine's memory safety keeps every limit at or
above problem.split_memory_limit() free of deadlocks (optimizer.exact.least_memory
covers the limits below it that fused backwards fit); the portfolio keeps the best.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from optimizer.ops import Op
from optimizer.problem import Problem
from optimizer.schedules import listengine


@dataclass(frozen=True)
class Policy:
    in_flight_factor: float  # a device admits up to factor * (its distance to the pipeline's end) microbatches
    backward_first: bool
    eager_weights: bool  # run W right after its B instead of when nothing else is ready

    def __str__(self) -> str:
        depth = "unbounded" if math.isinf(self.in_flight_factor) else f"{self.in_flight_factor:g}x"
        return f"list({depth}, {'B' if self.backward_first else 'F'} first, {'eager' if self.eager_weights else 'lazy'} W)"

    def engine_policy(self) -> listengine.Policy:
        return listengine.Policy(
            priority="backward" if self.backward_first else "forward",
            fill_w="eager" if self.eager_weights else "always",
            throttle=False,
            in_flight=self.in_flight_factor,
            reserve="one",
            w_order="oldest",
            force_w=False,
        )


def policies() -> list[Policy]:
    """Deepest admission and lazy W's first: they win most often (the 1x policies are close
    to the known 1F1B-depth schedules), and a solver short of time runs the first ones only."""
    grid = [Policy(f, b, w) for f, b, w in product((math.inf, 2.0, 1.5, 1.0), (True, False), (False, True))]
    return sorted(grid, key=lambda policy: policy.eager_weights)  # stable: depth order kept


def list_schedule(problem: Problem, policy: Policy, deadline: float | None = None) -> list[list[Op]]:
    """Per-device orders built by the engine under `policy` (it never gets stuck at any
    limit from problem.split_memory_limit() up). With vocabulary parallelism, the engine orders the
    problem without the passes and they are woven in (optimizer.schedules.vocab_passes;
    past `deadline`, time.monotonic(), the first way of weaving that fits is kept)."""
    if problem.vocab_parallel is not None:
        from optimizer.schedules.vocab_passes import base_problem, with_vocab_passes

        base_orders = listengine.schedule_with(base_problem(problem), policy.engine_policy())[0]
        return with_vocab_passes(problem, base_orders, deadline)
    return listengine.schedule_with(problem, policy.engine_policy())[0]
