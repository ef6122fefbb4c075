"""From a schedule to what each rank must do: checked ops and an agreed message order.

Before any compute, a plan refuses a schedule that cannot run: wrong world size, ops on
the wrong device, ops missing or repeated, or an order that deadlocks (the simulator
names each stuck device's next op).

Messages: an activation goes from F(s, i) to F(s+1, i) and a gradient from B/BW(s, i)
to B/BW(s-1, i) whenever the two stages sit on different devices; with token slices,
each slice's is its own message (from F(s, i, k) to F(s+1, i, k), and so on). Every rank derives
the same global message order from the simulated schedule (by send time, then a fixed
tie-break). Each rank issues its sends and receives *with one peer* in that order
(runtime/issue.py), so backends that match point-to-point messages by order (NCCL, one
stream per peer pair for both directions) pair them up; runtime/pairing.py proves, per
schedule, that no transfer waits behind one its peer has not reached. gloo additionally
matches them by tag. Receives are issued as early as that order allows, before the op
that consumes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.errors import InputError
from optimizer.schedule import Op, Schedule, ScheduleError, TimedOp
from optimizer.simulate import simulate_times
from optimizer.validate import validate

ACTIVATION, GRADIENT, HIDDEN = "activation", "gradient", "hidden"


@dataclass(frozen=True)
class Message:
    """One tensor from `src` to `dst`: the input `kind` of `stage` for `microbatch` (and `slice`)."""

    tag: int  # index in the global order; unique, so gloo can match on it
    kind: str  # ACTIVATION (input of F(stage)), GRADIENT (output grad of B(stage)) or HIDDEN (input of S)
    stage: int  # the consuming stage; num_stages for HIDDEN (the vocabulary passes after the last)
    microbatch: int
    src: int
    dst: int
    send_time: float
    slice: int = 0

    def describe(self) -> str:
        label = f"{self.microbatch}.{self.slice}" if self.slice else str(self.microbatch)
        if self.kind == HIDDEN:
            return f"hidden states for the vocabulary passes mb {label}"
        what = "activation" if self.kind == ACTIVATION else "gradient"
        return f"{what} for stage {self.stage} mb {label}"


@dataclass(frozen=True)
class RankPlan:
    """Everything one rank needs: its ops, and per peer the messages in issue order."""

    rank: int
    world_size: int
    num_stages: int
    num_microbatches: int
    stage_device: tuple[int, ...]
    ops: tuple[Op, ...]
    peer_messages: dict[int, tuple[Message, ...]]  # peer -> messages to or from it, in order
    predicted_makespan: float
    slice_shares: tuple[float, ...] = (1.0,)  # per token slice: its share of the tokens
    vocab_barriers: int = 0  # collectives per microbatch of the vocabulary passes; 0: none (runtime/vocab.py)

    @property
    def num_slices(self) -> int:
        return len(self.slice_shares)

    @property
    def stages(self) -> list[int]:
        return [s for s, d in enumerate(self.stage_device) if d == self.rank]

    def is_local(self, stage: int) -> bool:
        return self.stage_device[stage] == self.rank


def check_schedule(schedule: Schedule, world_size: int, source: str = "schedule") -> list[list[TimedOp]]:
    """Refuse a schedule this world cannot run; returns its ops with simulated times."""
    problem = schedule.problem
    if problem.num_devices != world_size:
        raise InputError(f"{source}: the schedule is for {problem.num_devices} devices, the world has {world_size} ranks")
    orders = schedule.order()
    timed = simulate_times(problem, orders)  # InputError on placement, DeadlockError on a deadlock
    # Memory limits are in the problem's units and a matter for the solver, not for running.
    structural = validate(problem.model_copy(update={"memory_limit": None}), timed)
    if structural:
        raise ScheduleError(source, structural)
    return timed


def build_plans(schedule: Schedule, world_size: int, source: str = "schedule") -> list[RankPlan]:
    """One plan per rank, all derived from the same global message order."""
    timed = check_schedule(schedule, world_size, source)
    problem = schedule.problem
    device_of = tuple(stage.device for stage in problem.stages)
    num_stages = problem.num_stages
    vocab_parallel = problem.vocab_parallel is not None

    pending: list[tuple[float, int, int, str, int, int, int]] = []
    for device, ops in enumerate(timed):
        for op in ops:
            if op.kind == "F" and op.stage + 1 < num_stages and device_of[op.stage + 1] != device:
                pending.append((op.end, device, device_of[op.stage + 1], ACTIVATION, op.stage + 1, op.microbatch, op.slice))
            if op.kind in ("B", "BW") and op.stage > 0 and device_of[op.stage - 1] != device:
                pending.append((op.end, device, device_of[op.stage - 1], GRADIENT, op.stage - 1, op.microbatch, op.slice))
        if vocab_parallel:  # the last stage's output goes to every device's S
            pending += [
                (op.end, device, other, HIDDEN, num_stages, op.microbatch, op.slice)
                for op in ops
                if op.kind == "F" and op.stage == num_stages - 1
                for other in range(world_size)
                if other != device
            ]
    pending.sort()
    messages = [Message(tag, kind, stage, mb, src, dst, time, k) for tag, (time, src, dst, kind, stage, mb, k) in enumerate(pending)]
    makespan = max((op.end for ops in timed for op in ops), default=0.0)

    plans = []
    for rank in range(world_size):
        per_peer: dict[int, list[Message]] = {}
        for message in messages:
            if rank in (message.src, message.dst):
                peer = message.dst if message.src == rank else message.src
                per_peer.setdefault(peer, []).append(message)
        plans.append(
            RankPlan(
                rank=rank,
                world_size=world_size,
                num_stages=num_stages,
                num_microbatches=problem.num_microbatches,
                stage_device=device_of,
                ops=tuple(op.op for op in timed[rank]),
                peer_messages={peer: tuple(msgs) for peer, msgs in per_peer.items()},
                predicted_makespan=makespan,
                slice_shares=problem.slice_shares(),
                vocab_barriers=problem.vocab_parallel.barriers if problem.vocab_parallel is not None else 0,
            )
        )
    if vocab_parallel:
        from runtime.pairing import pairing_deadlock  # it builds on the plans: imported here, not above

        stuck = pairing_deadlock(plans, by_order=False)  # the collectives' order, with gloo's matching of transfers
        if stuck is not None:
            raise InputError(f"{source}: its vocabulary collectives cannot run in microbatch order on every rank: {stuck}")
    return plans
