"""Choose the layer split together with the schedule.

A split changes every stage's times and memory and whether the limit can be met at all,
so splits are compared by the schedules they allow, not by a per-stage proxy:

1. candidates: the even split, the hand rules users apply (fewer blocks on the first and
   last stages), and the bottleneck split (the linear-partition dynamic program over each
   layer's work); each is scored by the best known schedule that fits its memory
   (every family, the automatic schedulers and the list policies, as `auto` starts);
2. local search: from the best scored split, hand one layer across a stage boundary
   while that shortens the best known schedule;
3. the solver (`auto`) with an equal share of the time left on each named split (the
   baselines a user would try by hand) and on the best searched splits that beat them;
   the shortest schedule wins, so it is never worse than a baseline given the same time.

Every split tried is reported with its score or the reason it cannot fit, so the choice
can be compared with the even split and the hand rules side by side.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from optimizer.errors import InfeasibleError, InputError
from optimizer.exact.incumbents import best_fitting, generator_candidates, objective_value
from optimizer.exact.least_memory import least_memory_candidate, split_backwards_fit
from optimizer.exact.options import SolveOptions
from optimizer.exact.portfolio import AUTOMATIC_SHARE, ESSENTIAL
from optimizer.layers import LayersProfile
from optimizer.problem import Problem
from optimizer.schedule import Schedule
from optimizer.schedules.listengine import rounded_up
from optimizer.split import (
    Placement,
    Split,
    SplitInfeasible,
    bottleneck_split,
    even_split,
    fixed_memory,
    hand_rule_splits,
    layer_memory,
    layer_work,
    least_memory_split,
    neighbours,
    split_problem,
)
from optimizer.vocab_layers import VocabSharding, shard_vocabulary

# Shares of the time limit: scoring the candidates, local search, then the solver.
CANDIDATE_SHARE = 0.25
LOCAL_SEARCH_SHARE = 0.25
SOLVED_SPLITS = 2  # searched splits the solver gets a share for, beside the named ones
# Where no split had a known schedule when the time ran out, the first one gets `auto`
# for this long (its starting points find a fitting schedule whenever one exists, even
# past it): p = 32, 32 layers, m = 8 at a 0.01 s limit had no schedule at all.
RESCUE_SECONDS = 0.5


@dataclass
class SplitTrial:
    """One split tried: its problem, best schedule so far, or why it cannot fit."""

    name: str
    split: Split
    problem: Problem | None = None
    schedule: Schedule | None = None
    reason: str | None = None  # why no schedule fits, when none does
    need: float | None = None  # the least memory limit this split needs, when it does not fit
    solver_seconds: float | None = None  # the time `auto` had on this split, when it had any
    held: list[float] | None = None  # per device, the memory its layers hold all step (parameter state)

    def value(self, objective: str) -> float:
        return objective_value(self.schedule, objective) if self.schedule is not None else float("inf")

    @property
    def unscored(self) -> bool:
        """Its problem fits the limit, but no schedule was found in the time it had."""
        return self.problem is not None and self.schedule is None and self.need is None


@dataclass
class BalanceResult:
    chosen: SplitTrial
    trials: list[SplitTrial] = field(default_factory=list)  # every split tried, in the order tried
    interrupted: bool = False  # Ctrl-C ended the search early: the best so far
    vocab: VocabSharding | None = None  # the vocabulary passes every problem had, if any


@dataclass
class _SplitSearch:
    """One search's fixed inputs and the splits it has tried so far."""

    profile: LayersProfile
    placement: Placement
    num_microbatches: int
    memory_limit: float | None
    options: SolveOptions
    solve: Callable[[Problem, SolveOptions], Schedule]
    on_trial: Callable[[SplitTrial], None] | None
    vocab: VocabSharding | None = None
    began: float = field(default_factory=time.monotonic)
    trials: list[SplitTrial] = field(default_factory=list)
    input_error: InputError | None = None  # the first split refused as input, if any

    def score(self, split: Split, name: str, deadline: float, essential_deadline: float | None = None) -> SplitTrial:
        """Try `split`: its best known fitting schedule (families and automatic schedulers;
        those run until `essential_deadline` when given, the others until `deadline`)."""
        trial = SplitTrial(name, split, held=fixed_memory(self.profile, self.placement, split, self.vocab))
        self.trials.append(trial)
        try:
            trial.problem = split_problem(self.profile, self.placement, split, self.num_microbatches, self.memory_limit, self.vocab)
        except SplitInfeasible as error:
            trial.reason, trial.need = str(error).removeprefix("memory_limit: "), error.need
        except InputError as error:
            # Its stages' sums pass what a problem takes (every layer within it, some stage's
            # sum not): this split is out, the others stand. Kept: where every split is out,
            # it is the reason (the size limit too), not the memory.
            trial.reason = str(error).removeprefix("split: ")
            self.input_error = self.input_error or error
        else:
            found, _ = generator_candidates(trial.problem, deadline=deadline, essential=ESSENTIAL, essential_deadline=essential_deadline)
            best = best_fitting(found, self.options.objective)
            if best is None and not split_backwards_fit(trial.problem):
                # Only fused backwards fit (a B that allocates): the least-memory order fits
                # every limit the split's problem was built under, where few families may.
                best = least_memory_candidate(trial.problem)
            if best is None:
                trial.reason = "no known schedule fitting its memory limit was found in time"
            else:
                trial.schedule = best.schedule
        if self.on_trial is not None:
            self.on_trial(trial)
        return trial

    def run(self) -> None:
        limit, objective = self.options.time_limit, self.options.objective
        candidate_deadline = self.began + CANDIDATE_SHARE * limit
        for name, split in candidate_splits(self.profile, self.placement, hand_rules=self.vocab is None).items():
            deadline = max(candidate_deadline, time.monotonic() + 0.05 * limit)
            # The even split is the baseline every choice is compared with: its automatic
            # schedulers may take most of the time (the families only their share, which
            # they take on large problems: 20 s for p = 256 at m = 65 before).
            self.score(split, name, deadline, self.began + AUTOMATIC_SHARE * limit if name == "even" else None)

        # Local search: one layer across one boundary at a time, first improvement, while time lasts.
        search_deadline = self.began + (CANDIDATE_SHARE + LOCAL_SEARCH_SHARE) * limit
        current = min(self.trials, key=lambda t: t.value(objective))
        improved = current.schedule is not None
        step = 0
        while improved and time.monotonic() < search_deadline:
            improved = False
            seen = {t.split for t in self.trials}
            for split in neighbours(current.split):
                if split in seen or time.monotonic() >= search_deadline:
                    continue
                step += 1
                trial = self.score(split, f"search {step}", search_deadline)
                if trial.value(objective) < current.value(objective) * (1 - 1e-9):
                    current, improved = trial, True
                    break

        # The named splits (the baselines a user would try by hand) and the best searched ones
        # all get the solver for the same share of the time left, so the reported comparison is
        # like for like and the chosen split is never worse than a baseline under it.
        fitting = [t for t in self.trials if t.schedule is not None]
        # A named split whose families ran out of time (not of memory) is solved too: at a
        # short limit the even split's automatic schedulers take most of the candidates'
        # share, and a hand rule 2.7% shorter was left unscored with time to spare.
        named = [t for t in self.trials if not t.name.startswith("search") and (t.schedule is not None or t.unscored)]
        searched = sorted((t for t in fitting if t.name.startswith("search")), key=lambda t: t.value(objective))
        to_beat = min((t.value(objective) for t in named), default=float("inf"))
        finalists = named + [t for t in searched[:SOLVED_SPLITS] if t.value(objective) < to_beat]
        for k, trial in enumerate(finalists):
            share = (self.began + limit - time.monotonic()) / (len(finalists) - k)
            if share <= 0.05:
                break
            assert trial.problem is not None
            try:
                solved = self.solve(trial.problem, replace(self.options, time_limit=share))
            except InfeasibleError:  # the split keeps the schedule it has; the others theirs
                continue
            finally:
                trial.solver_seconds = share
            # On a tie the solver's schedule is taken: it carries the lower bound and status
            # (a family's schedule that the solver only matched has none).
            if objective_value(solved, objective) <= trial.value(objective):
                trial.schedule, trial.reason = solved, None

    def rescue(self) -> list[SplitTrial]:
        """The first split tried that left no schedule for lack of time (not of memory),
        solved for RESCUE_SECONDS; [] when there is none, or its memory allows none."""
        for trial in self.trials:
            if trial.problem is None or trial.need is not None:
                continue
            try:
                trial.schedule = self.solve(trial.problem, replace(self.options, time_limit=RESCUE_SECONDS))
            except InfeasibleError as error:
                trial.reason = str(error)
                continue
            trial.reason = None
            return [trial]
        return []


def candidate_splits(profile: LayersProfile, placement: Placement, hand_rules: bool = True) -> dict[str, Split]:
    """The splits every search starts from, by name (duplicates dropped, first name kept).

    The hand rules make room for the embedding and the head on the end stages; under
    vocabulary parallelism those are sharded over every device and the rules are left out.
    """
    num_stages = placement.num_stages
    named: dict[str, Split] = {"even": even_split(profile, num_stages)}
    if hand_rules:
        named.update(hand_rule_splits(profile, num_stages))
    named["bottleneck"] = bottleneck_split(layer_work(profile), num_stages)
    # The split that needs the least memory, counted per device (a device may hold several
    # stages): the one to start from when the limit is tight.
    named["least memory"] = least_memory_split(layer_memory(profile), placement.device_of)
    unique: dict[str, Split] = {}
    for name, split in named.items():
        if split not in unique.values():
            unique[name] = split
    return unique


def choose_split(
    profile: LayersProfile,
    placement: Placement,
    num_microbatches: int,
    memory_limit: float | None,
    options: SolveOptions,
    solve: Callable[[Problem, SolveOptions], Schedule],
    on_trial: Callable[[SplitTrial], None] | None = None,
    vocab: VocabSharding | None = None,
) -> BalanceResult:
    """Search splits and schedules together within options.time_limit (see the module doc).

    `solve` is the solver for one fixed split (optimizer.exact.solve with method auto);
    it is passed in so this module does not depend on the portfolio. With `vocab`,
    `profile` is the trunk (optimizer.vocab_layers.shard_vocabulary) and every problem
    has the vocabulary passes.
    """
    search = _SplitSearch(profile, placement, num_microbatches, memory_limit, options, solve, on_trial, vocab)
    interrupted = False
    try:
        search.run()
    except KeyboardInterrupt:
        interrupted = True
    fitting = [t for t in search.trials if t.schedule is not None]
    if not fitting and not interrupted:
        # Time ran out before any split had a known schedule (many stages, a short limit):
        # the first split whose memory allows one is solved past the limit, as `auto`
        # finds a fitting schedule whenever one exists, however short its limit.
        try:
            fitting = search.rescue()
        except KeyboardInterrupt:
            interrupted = True
    if not fitting:
        if interrupted:
            raise KeyboardInterrupt
        if search.input_error is not None and all(t.problem is None and t.need is None for t in search.trials):
            raise search.input_error  # no split was a problem at all: not a memory question
        raise _no_split_fits(search.trials, memory_limit)
    chosen = min(fitting, key=lambda t: t.value(options.objective))
    return BalanceResult(chosen, search.trials, interrupted, vocab)


def choose_vocab_split(
    profile: LayersProfile,
    placement: Placement,
    num_microbatches: int,
    memory_limit: float | None,
    options: SolveOptions,
    solve: Callable[[Problem, SolveOptions], Schedule],
    barriers: Sequence[int],
    on_trial: Callable[[SplitTrial], None] | None = None,
) -> BalanceResult:
    """Vocabulary parallelism: the embedding and head sharded over every device, the blocks
    split with the schedule, for each barrier count in turn with an equal share of the time.

    With one barrier the last stage's backward waits for one collective instead of two,
    but each S does more (optimizer.vocab_layers); which is shorter depends on the
    schedule, so both are tried and the shorter schedule that fits wins. When neither
    fits, the error names the least limit either needs.
    """
    results: list[BalanceResult] = []
    infeasible: list[SplitInfeasible] = []
    began = time.monotonic()
    for k, count in enumerate(barriers):
        if results and time.monotonic() - began >= options.time_limit:
            # The limit is spent (the first count's schedules ran past it: at p = 256,
            # m = 39 one takes 3-7 s): the other counts would each cost as much again.
            break
        trunk, vocab = shard_vocabulary(profile, placement.num_devices, count)
        share = (options.time_limit - (time.monotonic() - began)) / (len(barriers) - k)
        try:
            result = choose_split(
                trunk, placement, num_microbatches, memory_limit, replace(options, time_limit=max(share, 0.01)), solve, on_trial, vocab
            )
        except SplitInfeasible as error:
            infeasible.append(error)
            continue
        results.append(result)
        if result.interrupted:
            break
    if not results:
        raise min(infeasible, key=lambda error: error.need)
    best = min(results, key=lambda r: r.chosen.value(options.objective))
    best.interrupted = any(r.interrupted for r in results)
    return best


def _no_split_fits(trials: list[SplitTrial], memory_limit: float | None) -> SplitInfeasible:
    least = min((t for t in trials if t.need is not None), key=lambda t: t.need or 0.0, default=None)
    if least is None or least.need is None:
        within = "" if memory_limit is None else f" within {memory_limit:g}"
        return SplitInfeasible(f"memory_limit: no split tried has a schedule{within}", float("inf"))
    return SplitInfeasible(
        f"memory_limit: no split fits {memory_limit:g}; the least any split tried needs is {rounded_up(least.need)} "
        f"({least.name}, {'/'.join(map(str, least.split))}): raise the limit or use more devices",
        least.need,
    )


def check_layers_fit(profile: LayersProfile, placement: Placement, what: str = "layers") -> None:
    """Refuse, before any search, a placement with more stages than the model has layers
    (`what` names them: the trunk's blocks under vocabulary parallelism)."""
    if placement.num_stages > profile.num_layers:
        raise InputError(
            f"layers: {profile.num_layers} {what} cannot fill the {placement.num_stages} stages of "
            f"{placement.name} on {placement.num_devices} devices (one layer each at least)"
        )
