"""The fluid bound (optimizer.exact.fluidbound): a proof only where no schedule is shorter."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections.abc import Callable

import pytest
from exact_brute_force import brute_force_optimum, count_orders
from factories import random_problem
from typer.testing import CliRunner

from benchmarks.published import published_problem, setting_named
from optimizer.cli import app
from optimizer.errors import InfeasibleError
from optimizer.exact import fluidbound, portfolio
from optimizer.exact.bounds import lower_bound
from optimizer.exact.fluidbound import FIRST_PROBE, _data, applicable, build_program, fluid_bound, grid, ramps
from optimizer.exact.incumbents import objective_value
from optimizer.exact.options import Progress, SolveOptions
from optimizer.exact.spantiming import timed_for
from optimizer.exact.timescale import integer_tables
from optimizer.exact.tracker import Tracker
from optimizer.formats.schedule_json import load_schedule
from optimizer.problem import uniform_problem
from optimizer.schedules import GENERATORS

pytestmark = pytest.mark.solver

# The bisection's own resolution: it stops within 0.2% of the span it was given, and a
# refuted Z is reported 1e-6 (relative) below itself. A bound is checked against the
# optimum with the solver's feasibility tolerance only.
TOLERANCE = 1e-6

runner = CliRunner()

# Two devices, two microbatches, tight limits (as in test_span_memory_heads): brute force
# settles each in seconds.
TINY = [
    *[(seed, "vshape", 1.0, (1.0,)) for seed in range(3)],
    *[(seed, "linear", 1.0, (1.0, 0.5)) for seed in range(6, 10)],
    *[(seed, "interleaved:2", 1.5, (1.0, 0.5)) for seed in (1, 3, 6)],
]


@pytest.mark.slow
@pytest.mark.parametrize("seed, placement, limit, sizes", TINY)
def test_never_above_the_brute_force_optimum(seed, placement, limit, sizes):
    problem = random_problem(random.Random(seed), 2, 2, placement, limit=limit, decimals=2, forward_memory=sizes)
    assert applicable(problem)
    assert count_orders(problem) <= 6000
    span, makespan = brute_force_optimum(problem, "span"), brute_force_optimum(problem, "makespan")
    # Bisect up to a Z well above the optimum: the bound must stop below it on its own (a
    # coarser grid than the default keeps the programs small; any step gives a valid bound).
    value = fluid_bound(problem, 0.0, 1.5 * span, time_limit=60, tolerance=1e-2, step=span / 200)
    assert value <= span * (1 + TOLERANCE)
    assert value <= makespan * (1 + TOLERANCE)


def test_a_cut_off_run_keeps_its_low_end():
    problem = published_problem(setting_named("1.5B-p8-m24"), 5.0, "vshape")
    # Far too little time to build and solve one program: nothing is proven.
    assert fluid_bound(problem, 123.0, 2000.0, time_limit=0.01) == 123.0


def test_a_program_without_a_verdict_proves_nothing_and_the_bisection_goes_on(monkeypatch):
    # The interior point method sometimes stops with neither verdict (no crossover). Such
    # an answer must neither end the search nor count as a proof: here the programs above
    # 100 have no verdict and those at or below 90 are refuted, so the bisection from
    # [50, 200] must come down past the silent ones and prove a Z in (88, 90].
    tested = _script_verdicts(monkeypatch, lambda z: None if z > 100 else z > 90)
    proofs: list[float] = []
    value = fluidbound.bisect(_tiny_data(), 50.0, 200.0, deadline=time.monotonic() + 30, tolerance=0.01, on_proof=proofs.append)
    assert any(z > 100 for z in tested)
    assert 88.0 < value <= 90.0
    assert proofs and max(proofs) == value
    # With below_probe="stop" a first probe without a verdict ends it, proving nothing.
    assert fluidbound.bisect(_tiny_data(), 50.0, 200.0, deadline=time.monotonic() + 30, below_probe="stop") == 50.0


def _tiny_data():
    return _data(random_problem(random.Random(3), 2, 2, "vshape", limit=1.0, decimals=2))


def _script_verdicts(monkeypatch, verdict: Callable[[float], bool | None]) -> list[float]:
    """Make every program's answer verdict(Z); the Z's tested are appended to the list returned."""
    tested: list[float] = []

    def answer(z: float) -> bool | None:
        tested.append(z)
        return verdict(z)

    monkeypatch.setattr(fluidbound, "build_program", lambda data, z, step, coarse=1: z)
    monkeypatch.setattr(fluidbound, "_feasible", lambda lp, seconds, threads: answer(lp))
    return tested


def _scripted_bisection(monkeypatch, fits_above: float, below_probe: str) -> tuple[float, list[float]]:
    """`bisect` on [100, 200] where a program fits exactly when Z > fits_above: its result
    and the Z's it tested."""
    tested = _script_verdicts(monkeypatch, lambda z: z > fits_above)
    value = fluidbound.bisect(_tiny_data(), 100.0, 200.0, deadline=time.monotonic() + 30, tolerance=0.001, below_probe=below_probe)
    return value, tested


def test_a_relaxation_above_the_known_bound_is_bisected_below_a_fitting_probe(monkeypatch):
    # The first probe (197) fits; the relaxation is refuted up to 150: bisecting on proves 150.
    value, tested = _scripted_bisection(monkeypatch, 150.0, "bisect")
    assert tested[0] == pytest.approx(200 * (1 - FIRST_PROBE))
    assert 149.8 <= value <= 150.0


def test_stop_ends_the_search_after_a_fitting_first_probe(monkeypatch):
    # Refuted only up to 110: "stop" ends after the first probe, proving nothing; "bisect"
    # goes down to 110.
    value, tested = _scripted_bisection(monkeypatch, 110.0, "stop")
    assert (value, len(tested)) == (100.0, 1)
    value, tested = _scripted_bisection(monkeypatch, 110.0, "bisect")
    assert 109.8 <= value <= 110.0 and len(tested) > 2


def test_a_refining_bisection_goes_on_with_a_finer_grid_once_it_has_settled(monkeypatch):
    # Scripted programs: on the first grid they fit above 150, on any finer one above 170
    # (a finer grid is a tighter relaxation). Settled at 150 with time left, the refining
    # bisection grows its samples and proves 170; without `refine` it stops at 150.
    data = _tiny_data()
    first_step = fluidbound.graded_step(data, 200.0, 10, 2)
    steps: list[float] = []

    def program(data, z, step, coarse=1):
        steps.append(step)
        return z, step

    def verdict(lp, seconds, threads):
        z, step = lp
        return z > (150.0 if step >= first_step else 170.0)

    monkeypatch.setattr(fluidbound, "build_program", program)
    monkeypatch.setattr(fluidbound, "_feasible", verdict)
    deadline = time.monotonic() + 30
    plain = fluidbound.bisect(data, 100.0, 200.0, deadline=deadline, samples=10, coarse=2, tolerance=0.001)
    assert 149.8 <= plain <= 150.0
    assert set(steps) == {first_step}
    refined = fluidbound.bisect(data, 100.0, 200.0, deadline=deadline, samples=10, coarse=2, tolerance=0.001, refine=True)
    assert 169.8 <= refined <= 170.0
    assert min(steps) < first_step / fluidbound.REFINE_FACTOR * 1.01


def test_an_unknown_below_probe_mode_is_refused():
    with pytest.raises(ValueError, match="below_probe"):
        fluidbound.bisect(_tiny_data(), 100.0, 200.0, deadline=time.monotonic() + 1, below_probe="never")


def test_below_every_duration_no_schedule_fits():
    assert build_program(_tiny_data(), 1e-3, 1e-3) is None


def test_not_applicable_where_a_fused_backward_or_slices_could_win():
    assert not applicable(random_problem(random.Random(1), 2, 2, "vshape", fused_saving=0.3))
    assert not applicable(random_problem(random.Random(1), 2, 2, "vshape", slices=2))
    assert fluid_bound(random_problem(random.Random(1), 2, 2, "vshape", slices=2), 5.0, 50.0, time_limit=10) == 5.0


@pytest.mark.slow
def test_sees_the_drain_the_static_bound_misses():
    # Zero Bubble's 1.5B times on 4 devices, V placement at V-Half's memory (3 activations),
    # 8 microbatches: v-auto's 446.6 ms is optimal (benchmarks/small_proofs.py proves it).
    # The static bound stops 12.7% below (389.7); the fluid bound, every device at once,
    # proves the first probe, 1.5% below, with one program (bisected further: 444.9). The
    # graded 300-step grid of the large problems' phase already refutes it (2.5 s; the
    # default 1000 steps: 13 s).
    problem = published_problem(dataclasses.replace(setting_named("1.5B-p8-m24"), p=4, m=8), 3.0, "vshape")
    best = objective_value(timed_for(problem, GENERATORS["v-auto"].build(problem), "span"), "span")
    static = lower_bound(problem, "span").value
    value = fluid_bound(problem, static, best, time_limit=120, tolerance=0.03, samples=300, coarse=fluidbound.COARSE)
    assert value <= best * (1 + TOLERANCE)
    assert value >= (1 - FIRST_PROBE) * best * (1 - TOLERANCE)
    assert value >= static + 0.04 * best


def _four_device_v_half(tmp_path):
    problem = published_problem(dataclasses.replace(setting_named("1.5B-p8-m24"), p=4, m=8), 3.0, "vshape")
    path = tmp_path / "problem.json"
    path.write_text(problem.model_dump_json())
    return path


@pytest.mark.slow
def test_solve_certify_cuts_the_gap_and_keeps_the_schedule(tmp_path, monkeypatch):
    # The default grid (1000 steps on 4 devices) takes 13 s a program; the 300-step grid
    # refutes the first probe as well (test_sees_the_drain_the_static_bound_misses) in
    # 2.5 s, and the bisection ends on its tolerance, not on --certify's 120 s (the time a
    # loaded machine may need: with six other processes on two cores 30 s were not enough).
    monkeypatch.setattr(fluidbound, "default_samples", lambda num_stages, budget=0: 300)
    path, out = _four_device_v_half(tmp_path), tmp_path / "schedule.json"
    args = ["solve", str(path), "-o", str(out), "--time-limit", "1", "--objective", "span", "--json", "--quiet"]
    plain = runner.invoke(app, args)
    certified = runner.invoke(app, [*args, "--certify", "120"])
    assert plain.exit_code == 0 and certified.exit_code == 0, certified.output
    before, after = (json.loads(r.stdout.strip().splitlines()[-1]) for r in (plain, certified))
    # In 1 s the static bound and the first device relaxations leave 12.7% (389.7 against
    # 446.6); the fluid bound proves 1.5% below v-auto's span with its first program.
    assert before["gap"] > 0.05
    assert after["gap"] <= FIRST_PROBE + 1e-6
    assert before["lower_bound"] < after["lower_bound"] <= after["makespan"] * (1 + TOLERANCE)
    assert load_schedule(out).metrics.gap == pytest.approx(after["gap"])


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--certify", "nan"], "--certify"),
        (["--certify", "inf"], "--certify"),
        (["--method", "1f1b", "--certify", "5"], "--certify: only with --method auto"),
    ],
)
def test_solve_certify_refuses_bad_values(tmp_path, extra, message):
    path = _four_device_v_half(tmp_path)
    result = runner.invoke(app, ["solve", str(path), "-o", str(tmp_path / "s.json"), *extra])
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "s.json").exists()


def _v_auto_tracker(problem):
    """A span Tracker holding v-auto's schedule of `problem` and the static bound."""
    assert applicable(problem)
    incumbent = timed_for(problem, GENERATORS["v-auto"].build(problem), "span")
    tracker = Tracker("span", 60.0)
    tracker.offer(incumbent, "v-auto")
    tracker.raise_bound(lower_bound(problem, "span").value, "static")
    return incumbent, objective_value(incumbent, "span"), tracker


@pytest.mark.slow
def test_the_auto_phase_raises_the_trackers_bound_and_skips_closed_gaps(monkeypatch):
    # The phase's grid at 300 steps (FLUID_SAMPLES) instead of 1000 on 4 devices: its first
    # program refutes the probe in 2.5 s instead of 13 (as in the test above). With 7 s the
    # phase starts (at 5 s its estimate says one program would not finish) and bisects on
    # until its deadline.
    monkeypatch.setattr(portfolio, "FLUID_BUDGET", 0)
    problem = published_problem(dataclasses.replace(setting_named("1.5B-p8-m24"), p=4, m=8), 3.0, "vshape")
    incumbent, best, tracker = _v_auto_tracker(problem)
    portfolio.fluid_bound(problem, integer_tables(problem), SolveOptions(objective="span"), tracker, time.monotonic() + 7)
    assert (1 - FIRST_PROBE) * best * (1 - TOLERANCE) <= tracker.bound <= best * (1 + TOLERANCE)
    # Within FLUID_MIN_GAP of the incumbent it does not start a worker at all.
    closed = Tracker("span", 60.0)
    closed.offer(incumbent, "v-auto")
    closed.raise_bound(best * (1 - portfolio.FLUID_MIN_GAP / 2), "given")
    started = time.monotonic()
    portfolio.fluid_bound(problem, integer_tables(problem), SolveOptions(objective="span"), closed, time.monotonic() + 30)
    assert time.monotonic() - started < 0.5
    assert closed.bound == best * (1 - portfolio.FLUID_MIN_GAP / 2)


def _alongside(problem, tracker: Tracker, seconds: float, enough: float = math.inf) -> fluidbound.FluidRun | None:
    """Start the large problems' phase and wait for its worker as the search would: at most
    `seconds`, or until it has proven `enough`. The run, or None when it did not start one;
    the tracker still watches it."""
    until = time.monotonic() + seconds
    portfolio.fluid_bound_alongside(problem, integer_tables(problem), SolveOptions(objective="span"), tracker, until)
    if not tracker.watched:
        return None
    run = tracker.watched[0][0]
    assert isinstance(run, fluidbound.FluidRun)
    while time.monotonic() < until and run.value() < enough:
        run.wait(min(until, time.monotonic() + 0.2))
    return run


@pytest.mark.slow
def test_the_auto_phase_settles_the_gap_on_eight_devices():
    # Zero Bubble's 1.5B setting on the V placement at V-Half's memory: the device
    # relaxations leave 9.7% open at 60 s; the phase's coarser grid still refutes 1.5% below
    # v-auto's span within its first program.
    problem = published_problem(setting_named("1.5B-p8-m24"), 5.0, "vshape")
    assert not portfolio._small(problem, SolveOptions(objective="span"))
    _, best, tracker = _v_auto_tracker(problem)
    assert tracker.bound < 0.95 * best
    run = _alongside(problem, tracker, 40, enough=(1 - FIRST_PROBE) * best * (1 - TOLERANCE))
    assert run is not None
    tracker.collect()
    assert (1 - FIRST_PROBE) * best * (1 - TOLERANCE) <= tracker.bound <= best * (1 + TOLERANCE)
    tracker.release()
    assert not tracker.watched and run._process is None  # the worker is stopped


@pytest.mark.slow
def test_the_auto_phase_bisects_below_a_fitting_probe_on_large_problems():
    # Zero Bubble's 1.5B setting on the V placement at V-Min's memory (4 activations): the
    # relaxation fits 1.5% below v-auto's span (memory's discreteness binds, which it
    # relaxes); alongside the search it has the time to bisect on below the probe: about
    # 1330-1360 against the static 1237 in 20-40 s.
    problem = published_problem(setting_named("1.5B-p8-m24"), 4.0, "vshape")
    _, best, tracker = _v_auto_tracker(problem)
    static = tracker.bound
    assert _alongside(problem, tracker, 40, enough=static * 1.05) is not None
    tracker.release()
    assert static * 1.05 <= tracker.bound < (1 - FIRST_PROBE) * best


def test_a_phase_gets_the_time_of_its_first_answer_when_its_share_is_shorter():
    # On 4 devices of the V placement (m = 8, 288 ops: the fluid phase runs in front) one
    # program on the 1000-step grid takes about 5 s: at a short limit the phase's share
    # would end it inside its first program, which then proves nothing.
    fluid = next(phase for phase in portfolio.PHASES if phase.run is portfolio.fluid_bound)
    problem = published_problem(dataclasses.replace(setting_named("1.5B-p8-m24"), p=4, m=8), 3.0, "vshape")
    assert fluid.applies(problem, SolveOptions(objective="span"))
    need = portfolio.fluid_program_seconds(problem)
    assert need > portfolio.FLUID_MIN_SECONDS
    assert fluid.seconds(problem, "span", 1.2 * need) == pytest.approx(need)  # share: 0.6 need
    assert fluid.seconds(problem, "span", 0.5 * need) == pytest.approx(0.5 * need)  # never past the time left
    assert fluid.seconds(problem, "span", 4 * need) == pytest.approx(portfolio.FLUID_SHARE * 4 * need)


def test_large_problems_prove_alongside_the_search_not_in_front():
    options = SolveOptions(objective="span")
    problem = published_problem(setting_named("28.3B-p32-m96"), 17.0, "vshape")
    applying = [phase.run for phase in portfolio.PHASES if phase.applies(problem, options)]
    assert portfolio.fluid_bound_alongside in applying and portfolio.fluid_bound not in applying
    # It starts before the order search, which leaves a core free.
    assert applying.index(portfolio.fluid_bound_alongside) < applying.index(portfolio.order_search)


@pytest.mark.slow
def test_the_phase_does_not_start_a_program_it_cannot_finish():
    # p = 32 on the V placement with less time than FLUID_START_SHARE of one program's
    # estimate: no worker starts and the bound stays.
    problem = published_problem(setting_named("28.3B-p32-m96"), 17.0, "vshape")
    incumbent = timed_for(problem, GENERATORS["v-half"].build(problem), "span")
    tracker = Tracker("span", 60.0)
    tracker.offer(incumbent, "v-half")
    tracker.raise_bound(0.9 * objective_value(incumbent, "span"), "given")
    short = 0.9 * portfolio.FLUID_START_SHARE * portfolio.fluid_program_seconds(problem, portfolio.FLUID_FIRST_SAMPLES)
    assert short > portfolio.FLUID_MIN_SECONDS
    started = time.monotonic()
    assert _alongside(problem, tracker, short) is None
    assert time.monotonic() - started < 0.5
    assert tracker.bound == 0.9 * objective_value(incumbent, "span")


def test_solve_certify_refuses_a_layers_file(tmp_path):
    layers = tmp_path / "layers.json"
    assert runner.invoke(app, ["layers", "--blocks", "8", "--vocab", "128000", "-o", str(layers)]).exit_code == 0
    result = runner.invoke(app, ["solve", str(layers), "-p", "4", "-m", "8", "--certify", "5", "-o", str(tmp_path / "s.json")])
    assert result.exit_code == 2
    assert "--certify: only for a problem file" in result.output
    assert not (tmp_path / "s.json").exists()


@pytest.mark.slow
def test_stop_below_probe_gives_up_where_the_first_probe_fits():
    # V-Min's memory on 4 devices (1.5B, m = 8): the optimum is 531.5, the fluid relaxation
    # reaches about 491 (memory's discreteness, which it relaxes, is what binds), so its
    # program fits at 1.5% below the optimum. Inside `auto` that one program is all it
    # spends; bisecting on raises the bound above the static one.
    # (On the graded 200-step grid: 1.4 s for the stop, 3.5 s to bisect to 470.4 against
    # the static 452.7; 500 uniform steps took 5.3 and 16.8 s to 488.1.)
    problem = published_problem(dataclasses.replace(setting_named("1.5B-p8-m24"), p=4, m=8), 2.0, "vshape")
    static = lower_bound(problem, "span").value
    coarse = fluidbound.COARSE
    assert fluid_bound(problem, static, 531.5, time_limit=60, samples=200, coarse=coarse, below_probe="stop") == static
    raised = fluid_bound(problem, static, 531.5, time_limit=60, samples=200, coarse=coarse, tolerance=0.05)
    assert static < raised <= 531.5


@pytest.mark.slow
def test_the_least_shortfall_is_nothing_at_a_schedules_span_and_refutes_below_the_work():
    # The program is always feasible: ending by Z is met up to the shortfall it minimizes.
    problem = published_problem(dataclasses.replace(setting_named("1.5B-p8-m24"), p=4, m=8), 3.0, "vshape")
    _, best, _ = _v_auto_tracker(problem)
    data = _data(problem)
    at_span = build_program(data, best, best / 300)
    assert at_span is not None
    least = fluidbound.shortfall(at_span, 60, 2)
    assert least is not None and least <= fluidbound.SHORTFALL_TOLERANCE
    # Device 0 cannot do all its work by 0.99 of it: short by far more than the tolerance.
    device = data.device
    work = sum(data.duration[k][s] for k in "FBW" for s in range(data.num_stages) if device[s] == device[0])
    z = 0.99 * work * data.num_microbatches
    below = build_program(data, z, z / 300)
    assert below is not None
    least = fluidbound.shortfall(below, 60, 2)
    assert least is not None and least > 100 * fluidbound.SHORTFALL_TOLERANCE


def test_the_graded_grid_keeps_every_step_in_the_ramps_and_thins_out_between():
    problem = published_problem(setting_named("1.5B-p8-m64"), 5.0, "vshape")
    data = _data(problem)
    z, step, coarse = 3200.0, 4.0, 4
    warm, drain = ramps(data)
    assert 0 < warm < z / 4 and 0 < drain < z / 2  # a steady state in between
    uniform, points = grid(data, z, step), grid(data, z, step, coarse)
    last = math.floor(z / step) + 1
    assert uniform == list(range(last + 1))
    assert points[0] == 0 and points[-1] == last
    gaps = [b - a for a, b in zip(points, points[1:])]
    assert min(gaps) >= 1 and max(gaps) == coarse
    for a, gap in zip(points, gaps):
        if a < warm / step - 1 or a * step >= z - drain:
            assert gap == 1, (a, gap)
    assert len(points) < 0.7 * len(uniform)


# Random problems with a steady state (m = 10 on 2-3 devices): every schedule's own counts
# (ops started, work done, by each sample time, its first op at 0) must meet every row of
# the program at its span, on uniform and coarse grids alike, with no shortfall. That is
# what makes a refuted Z a proof; the rounding of each row goes the relaxing way on any
# grid of multiples of the step.
GRADED = [(seed, placement, p) for seed in range(4) for placement, p in (("vshape", 2), ("linear", 3))]
# Float noise in the rows' sums (times and counts of order 100).
ROW_SLACK = 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("seed, placement, p", GRADED)
def test_every_schedule_meets_the_program_at_its_span_on_coarse_grids(seed, placement, p):
    problem = random_problem(random.Random(seed), p, 10, placement, limit=2.0, decimals=2, forward_memory=(1.0, 0.5))
    assert applicable(problem)
    data = _data(problem)
    schedules = []
    for name in ("1f1b", "zb-h1", "greedy", "v-auto", "zb-auto", "gpipe"):
        generator = GENERATORS.get(name)
        if generator is None or generator.reason(problem) is not None:
            continue
        try:
            schedule = timed_for(problem, generator.build(problem), "span")
        except InfeasibleError:
            continue
        if schedule.fits_memory():
            schedules.append(schedule)
    assert len(schedules) >= 2
    for schedule in schedules:
        # Device 0's own span (the program's Z), tightest for the rows that count to its end,
        # and a little above it; steps that divide it and steps that do not.
        span = _first_device_span(schedule)
        for z in (span, 1.013 * span):
            for coarse in (1, 2, 5):
                for step in (z / 80, z / 80.7, fluidbound.graded_step(data, z, 60, coarse)):
                    if coarse > 1:
                        assert len(grid(data, z, step, coarse)) < len(grid(data, z, step))
                    lp = build_program(data, z, step, coarse)
                    assert lp is not None
                    _assert_meets_every_row(lp, schedule)


def _first_device_span(schedule) -> float:
    """From the first op (stage 0's first forward) to device 0's last end."""
    ops = [op for device in schedule.devices for op in device]
    origin = min(op.start for op in ops if op.kind == "F" and op.stage == 0)
    first = schedule.problem.tables().device[0]
    return max(op.end for op in schedule.devices[first]) - origin


def _assert_meets_every_row(lp, schedule) -> None:
    """The schedule's own values (see fluidbound._Program.meaning) within every bound and row.
    A fused backward counts as its B then its W (the program applies where fusing never wins)."""
    tables = schedule.problem.tables()
    ops = []
    for op in (op for device in schedule.devices for op in device):
        if op.kind == "BW":
            split = op.start + tables.backward_input[op.stage]
            ops += [op._replace(kind="B", end=split), op._replace(kind="W", start=split)]
        else:
            ops.append(op)
    origin = min(op.start for op in ops if op.kind == "F" and op.stage == 0)
    device_of = tables.device

    def value(meaning: tuple) -> float:
        if meaning[0] == "started":
            (kind, stage), t = meaning[1], meaning[2]
            return float(sum(1 for op in ops if (op.kind, op.stage) == (kind, stage) and op.start - origin <= t + ROW_SLACK))
        if meaning[0] == "done":
            device, t = meaning[1], meaning[2]
            return sum(min(max(t - (op.start - origin), 0.0), op.end - op.start) for op in ops if device_of[op.stage] == device)
        return 0.0  # the shortfall

    values = [value(meaning) for meaning in lp.meaning]
    for v, (x, low, high) in enumerate(zip(values, lp.lower, lp.upper)):
        assert low - ROW_SLACK <= x <= high + ROW_SLACK, (lp.meaning[v], x, low, high)
    for low, high, columns, coefficients in lp.rows:
        total = sum(values[c] * a for c, a in zip(columns, coefficients))
        assert low - ROW_SLACK <= total <= high + ROW_SLACK, ([lp.meaning[c] for c in columns], total, low, high)


class _FakeSource:
    def __init__(self, value: float, failed: str | None = None):
        self.proven, self.closed, self.failed = value, False, failed

    def value(self) -> float:
        return self.proven

    def close(self) -> None:
        self.closed = True

    def failure(self) -> str | None:
        return self.failed


def test_auto_warns_of_a_fluid_worker_that_failed(tmp_path, monkeypatch, capsys):
    # `auto`'s fluid phase took a failed worker for "no proof" without a word. Here a
    # worker that fails as an interpreter without pipesched would; the phase is given its
    # time directly.
    from optimizer.cli import _ProgressLine
    from optimizer.exact.timescale import integer_tables
    from optimizer.schedules import generate

    failing = tmp_path / "python"
    failing.write_text("#!/bin/sh\necho 'ImportError: no pipesched here' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setattr(fluidbound.sys, "executable", str(failing))
    problem = published_problem(dataclasses.replace(setting_named("1.5B-p8-m24"), p=4, m=8), 3.0, "vshape")
    reports: list[Progress] = []
    tracker = Tracker("span", 60.0, on_progress=reports.append)
    tracker.offer(generate(problem, "v-auto"), "v-auto")
    portfolio.fluid_bound(problem, integer_tables(problem), SolveOptions(objective="span"), tracker, time.monotonic() + 30)
    warnings = [r.warning for r in reports if r.warning is not None]
    assert len(warnings) == 1 and "the fluid bound's worker failed: ImportError: no pipesched here" in warnings[0]
    # The command line prints each warning once, on stderr, with --quiet too.
    line = _ProgressLine(quiet=True)
    for report in reports + reports:
        line.update(report)
    assert capsys.readouterr().err.splitlines() == [f"warning: {warnings[0]}"]


def test_a_watched_source_that_failed_is_a_warning_on_release():
    # A failed worker alongside the search was taken for "no proof" without a word.
    reports: list[Progress] = []
    tracker = Tracker("span", 60.0, on_progress=reports.append)
    tracker.watch(_FakeSource(1.0, failed="the fluid bound's worker failed: MemoryError"), "alongside")
    tracker.watch(_FakeSource(2.0), "fine")
    tracker.release()
    assert [r.warning for r in reports if r.warning is not None] == ["the fluid bound's worker failed: MemoryError"]


def test_the_tracker_takes_a_watched_bound_at_each_collect_and_stops_it_on_release():
    tracker = Tracker("span", 60.0)
    source = _FakeSource(10.0)
    tracker.watch(source, "alongside")
    tracker.collect()
    assert (tracker.bound, tracker.bound_reason) == (10.0, "alongside")
    source.proven = 12.0  # proven later, before the end
    tracker.release()
    assert tracker.bound == 12.0 and source.closed and not tracker.watched


def test_a_watched_bound_is_stopped_once_the_gap_is_closed():
    from optimizer.problem import uniform_problem
    from optimizer.schedules import generate

    tracker = Tracker("makespan", 60.0)
    assert tracker.offer(generate(uniform_problem(2, 4), "1f1b"), "1f1b")
    best = tracker.best_value
    far, near = _FakeSource(0.5 * best), _FakeSource(0.5 * best)
    tracker.watch(far, "far", until_gap=0.001)
    tracker.watch(near, "near", until_gap=0.01)
    tracker.collect()
    assert not far.closed and not near.closed  # 50% open
    near.proven = 0.995 * best  # within near's 1%, not within far's 0.1%
    tracker.collect()
    assert near.closed and not far.closed
    assert [reason for _, reason, _ in tracker.watched] == ["far"]


@pytest.mark.slow
@pytest.mark.parametrize("interrupted", [False, True])
def test_no_worker_outlives_auto(monkeypatch, interrupted):
    # 1.5B p8 m24 at V-Min's memory (1152 ops): the fluid worker starts before the order
    # search; it is stopped when `auto` ends, also on Ctrl-C during the search.
    from optimizer.exact import api

    problem = published_problem(setting_named("1.5B-p8-m24"), 4.0, "vshape")
    runs: list[fluidbound.FluidRun] = []
    start = fluidbound.FluidRun.__init__

    def record(self, *args, **kwargs):
        start(self, *args, **kwargs)
        runs.append(self)

    monkeypatch.setattr(fluidbound.FluidRun, "__init__", record)
    # On a loaded machine the phases before it can leave too little time for a first
    # program, and the worker is rightly not started; this test is about stopping it.
    monkeypatch.setattr(portfolio, "_fluid_worth_starting", lambda *args, **kwargs: True)
    if interrupted:

        def interrupt(*args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(portfolio, "order_search", interrupt)
        monkeypatch.setattr(
            portfolio, "PHASES", tuple(dataclasses.replace(p, run=interrupt) if p.name == "order search" else p for p in portfolio.PHASES)
        )
    schedule = api.solve(problem, "auto", SolveOptions(time_limit=5, objective="span"))
    assert len(runs) == 1 and runs[0]._process is None
    assert schedule.metrics.lower_bound is not None and schedule.metrics.lower_bound <= objective_value(schedule, "span")


def test_a_failed_worker_is_said_not_taken_for_no_proof(tmp_path, monkeypatch):
    # The worker's stderr went nowhere: a worker that died proved "nothing", silently, and
    # `solve --certify` left the gap as it was without a word. A setting the worker cannot
    # use (a grid size that is not a number) makes it fail at its first program.
    problem = uniform_problem(2, 4, placement="vshape", memory_limit=3.0)
    with pytest.raises(fluidbound.FluidWorkerError, match="the fluid bound's worker failed: TypeError"):
        fluid_bound(problem, 1.0, 40.0, time_limit=30, samples="many")  # type: ignore[arg-type]  # what the worker cannot use
    with fluidbound.FluidRun(problem, 1.0, 40.0, time_limit=30) as run:
        run.wait(time.monotonic() + 30)
        assert run.failure() is None and run.value() > 1.0  # a worker that ends well
    # The CLI says so in one line and still writes the schedule with the bound it had.
    # (a problem whose gap stays open at 1 s, test_solve_certify_cuts_the_gap_and_keeps_the_schedule)
    certify = fluidbound.certify

    def certify_failing(*args):
        monkeypatch.setattr(fluidbound, "default_samples", lambda num_stages, budget=0: "many")  # not in the solve before
        return certify(*args)

    monkeypatch.setattr(fluidbound, "certify", certify_failing)
    path, out = _four_device_v_half(tmp_path), tmp_path / "schedule.json"
    result = runner.invoke(
        app, ["solve", str(path), "-o", str(out), "--time-limit", "1", "--objective", "span", "--certify", "30", "--quiet"]
    )
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: --certify:")]
    assert len(warnings) == 1 and "TypeError" in warnings[0], result.stderr
    assert load_schedule(out).metrics.lower_bound is not None
