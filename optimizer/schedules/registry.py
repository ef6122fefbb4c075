"""Schedule generators by name: each maps a problem to per-device op orders."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from optimizer.errors import InfeasibleError
from optimizer.ops import Op
from optimizer.problem import Problem

Orders = list[list[Op]]
# Hears a build's best orders so far (Generator.build_by).
Keep = Callable[[Orders], None]
# Says whether the caller has stopped waiting for a build (Generator.build_by): the build
# may then end at once, with anything or nothing, since nobody takes its result.
Abandoned = Callable[[], bool]


@dataclass(frozen=True)
class Generator:
    """A named schedule family.

    `build` returns per-device op orders (timed later by the simulator); `unsupported`
    returns why the family does not apply to a problem, or None when it does. `slices`:
    the family orders token slices (a problem with num_slices > 1); the others apply to
    unsliced problems only. On a problem with vocabulary parallelism every family builds
    its order for the problem without the passes and the passes are woven in
    (optimizer.schedules.vocab_passes). `alias`: another name for a family (not built
    twice by `compare` or the solver). `build_by`: for a family that tries candidates one
    after another (an automatic scheduler), the same build stopping at a deadline
    (time.monotonic()) with the best it has by then, handing each better one to `keep`
    as it goes (so that a caller that cannot wait for the candidate being built still
    has the best before it); the solver calls it through `build_within`, so that its
    time limit holds.
    """

    name: str
    summary: str
    build: Callable[[Problem], Orders]
    unsupported: Callable[[Problem], str | None]
    slices: bool = False
    alias: bool = False
    vocab_only: bool = False  # applies only to problems with vocabulary parallelism
    build_by: Callable[[Problem, float, Keep | None, Abandoned | None], Orders] | None = None
    # Never returns orders over the memory limit: raises InfeasibleError instead (greedy).
    within_limit: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "build", _with_vocab_passes(self.build, within_limit=self.within_limit))

    def build_within(
        self,
        problem: Problem,
        deadline: float,
        keep: Keep | None = None,
        abandoned: Abandoned | None = None,
        weave_by: float | None = None,
    ) -> Orders:
        """The family's orders, from the build that stops at `deadline` where it has one
        (and weaving vocabulary passes the first way that fits once `weave_by`, by default
        `deadline`, has passed). `keep` hears the best orders so far of a build that has a
        deadline (not where vocabulary passes are still to be woven in: those orders would
        lack them); once `abandoned()` is true the build may end at once (in a thread nobody
        waits for any more)."""
        weave_deadline = deadline if weave_by is None else weave_by
        build_by = self.build_by
        if build_by is None:
            # `build` weaves passes itself, but on the problem without them it builds plainly.
            return _with_vocab_passes(self.build, weave_deadline, within_limit=self.within_limit)(problem)
        if problem.vocab_parallel is not None:
            keep = None

        def plain_build(plain: Problem) -> Orders:
            return build_by(plain, deadline, keep, abandoned)

        return _with_vocab_passes(plain_build, weave_deadline, within_limit=self.within_limit)(problem)

    def reason(self, problem: Problem) -> str | None:
        """Why the family does not apply to `problem` (None: it does), slices included."""
        if problem.num_slices > 1 and not self.slices:
            return f"does not order token slices (the problem has num_slices = {problem.num_slices})"
        if problem.vocab_parallel is None or self.vocab_only:
            return self.unsupported(problem)
        return self.unsupported(problem.without_vocab())


def _with_vocab_passes(
    build: Callable[[Problem], Orders], deadline: float | None = None, *, within_limit: bool = False
) -> Callable[[Problem], Orders]:
    def built(problem: Problem) -> Orders:
        if problem.vocab_parallel is None:
            return build(problem)
        from optimizer.schedule import orders_fit
        from optimizer.schedules.listengine import check_memory_feasible
        from optimizer.schedules.vocab_passes import base_problem, with_vocab_passes  # it builds on this module

        try:
            base_orders = build(base_problem(problem))
        except InfeasibleError:
            # The base problem's limit is lowered by the passes' memory: where the whole
            # problem does not fit either, say so in its own numbers.
            check_memory_feasible(problem)
            raise
        orders = with_vocab_passes(problem, base_orders, deadline)
        if within_limit and not orders_fit(problem, orders):
            # No way of weaving the passes into the base fits (the passes are then placed
            # ignoring the limit): say which limit would fit, or that this base does not.
            check_memory_feasible(problem)
            raise InfeasibleError("memory_limit: the vocabulary passes do not fit the limit woven into this order; try --method auto")
        return orders

    return built


def vocab_variant(generator: Generator, paper: str) -> Generator:
    """The family under its vocabulary-parallel name (`1f1b-vocab`): the same schedule, for
    problems with vocabulary parallelism only."""

    def unsupported(problem: Problem) -> str | None:
        if problem.vocab_parallel is None:
            return "needs vocabulary parallelism (the problem's vocab_parallel field, or a layers file solved with --vocab-parallel)"
        return generator.unsupported(problem.without_vocab())

    summary = f"{paper} with vocabulary passes (vocabulary parallelism)"
    return Generator(f"{generator.name}-vocab", summary, generator.build, unsupported, alias=True, vocab_only=True)


def any_problem(problem: Problem) -> str | None:
    return None


def linear_only(problem: Problem) -> str | None:
    placement = problem.placement()
    return None if placement == "linear" else f"needs the linear placement (one stage per device), got {placement}"


def sliced_only(problem: Problem) -> str | None:
    """For the token-slice families: at one slice they are their unsliced parent family."""
    return None if problem.num_slices > 1 else "needs token slices (num_slices > 1; pipesched problem --slices K)"
