"""Known schedule families, registered by name, and the helpers to run them."""

from __future__ import annotations

from optimizer.errors import InfeasibleError, InputError
from optimizer.problem import Problem, require_problem
from optimizer.schedule import Schedule
from optimizer.schedules import (
    dualpipe_v,
    gpipe,
    greedy,
    interleaved,
    interleaved_auto,
    interleaved_zb,
    one_f_one_b,
    paced,
    seq1f1b,
    seq1f1b_zb,
    terapipe,
    v_auto,
    v_greedy,
    v_half,
    v_min,
    zb_auto,
    zb_h1,
    zb_h2,
    zb_v,
)
from optimizer.schedules.registry import Generator, vocab_variant
from optimizer.simulate import simulate

# Each family module exposes GENERATOR. The order is the order `compare` lists ties in and
# the order in which the solver builds its starting points: the automatic schedulers come
# first, so that a short time limit, which cuts that phase off, still gets them, then
# `paced`, which is quick and far ahead of them on the V placement below V-Min's memory
# (7.6-21.3%: at the end of the list a 5 s limit at p = 32 cut it off, and `auto` returned 12-19%
# longer than it).
GENERATORS: dict[str, Generator] = {
    module.GENERATOR.name: module.GENERATOR
    for module in (
        zb_auto,
        v_auto,
        paced,
        gpipe,
        one_f_one_b,
        interleaved,
        interleaved_zb,
        interleaved_auto,
        zb_h1,
        zb_h2,
        zb_v,
        v_greedy,
        v_half,
        v_min,
        dualpipe_v,
        terapipe,
        seq1f1b,
        seq1f1b_zb,
        greedy,
    )
}
# The vocabulary-parallel variants the paper gives, under their own names (any family
# places the passes on a problem with vocabulary parallelism).
GENERATORS.update(
    {
        variant.name: variant
        for variant in (
            vocab_variant(GENERATORS["1f1b"], "1F1B"),
            vocab_variant(GENERATORS["zb-h1"], "ZB-H1"),
            vocab_variant(GENERATORS["v-half"], "V-Half"),
        )
    }
)


def get_generator(name: str) -> Generator:
    try:
        return GENERATORS[name]
    except KeyError:
        raise InputError(f"method: unknown schedule '{name}' (known: {', '.join(GENERATORS)})") from None


def generate(problem: Problem, name: str) -> Schedule:
    """Build and time the named schedule; a clear error when the family does not apply."""
    require_problem(problem)
    generator = get_generator(name)
    reason = generator.reason(problem)
    if reason is not None:
        raise InputError(f"{name}: {reason}")
    return simulate(problem, generator.build(problem), method=name)


def applicable(problem: Problem) -> list[Generator]:
    require_problem(problem)
    return [g for g in GENERATORS.values() if not g.alias and g.reason(problem) is None]


def generate_all(problem: Problem) -> tuple[dict[str, Schedule], dict[str, str]]:
    """Every applicable family's schedule keyed by name, and why any family built none.

    Hand-made families ignore the memory limit (their schedules may exceed it); a
    memory-aware family that cannot fit the limit is listed with its reason instead.
    """
    schedules: dict[str, Schedule] = {}
    refused: dict[str, str] = {}
    for g in applicable(problem):
        try:
            schedules[g.name] = simulate(problem, g.build(problem), method=g.name)
        except InfeasibleError as error:
            refused[g.name] = str(error)
    return schedules, refused
