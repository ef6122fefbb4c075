"""Lower bounds for problems with token slices or a fused backward shorter than B + W.

optimizer.exact.bounds assumes one slice and backwards that gain nothing from fusing;
this module bounds every problem, and `lower_bound` sends each problem to the tighter
one that is valid for it.

Relaxed durations. Where a stage's fused backward BW (of a slice) is shorter than B + W,
a schedule may run either. Replace both by B' = min(B, BW) followed by W' = min(BW, B + W)
- B' (possibly 0): a fused BW becomes B' then W', together exactly BW long, with the
input gradient ready no later; a split B, W becomes B' <= B and W' <= W. Every schedule
thus maps to one of the relaxed ops that is no longer (as-soon-as-possible times only
shrink when durations do), so a bound on the relaxed problem is a bound. Where fusing
cannot win, B' = B and W' = W.

Heads and tails per slice. As in optimizer.exact.bounds, every op gets an earliest start
(head) from the chains that must precede it and a least amount of work that must follow
it (tail), and each device is a one-machine problem with release dates and delivery
times whose preemptive optimum (Jackson) bounds the makespan. The chains are the
dependencies of optimizer.ops (a slice's forward after the previous slice's on its
stage, a backward after the next slice's), and, from optimizer.exact.canonical, each
class (kind, stage, slice) in microbatch order: Fs and backwards (B or BW) always, Ws only
where fusing cannot win (a split W may wait past a later fused backward). No memory
argument is used here: leaving the memory limit out only relaxes further.

Span: every device's busy time (with the relaxed durations) bounds its span.

Vocabulary passes (S and T on every device): removing them leaves a relaxation (fewer
ops, dependencies and memory), so every bound of the problem without them holds. On top,
the passes join each device's one-machine problem: S of microbatch j starts no earlier
than the last stage's F of j ends (plus the transfer), T no earlier than S ends plus the
collective; after S comes at least the collective and T, and, when the last stage's
backward waits for the passes, the collective(s), that backward and its own tail. The
span: each device's busy time, passes included.

Unsliced problems with a fused gain get more: `split_relaxation` writes the relaxed
durations as a plain problem, on which all of optimizer.exact.bounds (memory included)
and the device relaxations hold.
"""

from __future__ import annotations

from optimizer.errors import InputError
from optimizer.exact.bounds import LowerBound, durations, heads, jackson_preemptive
from optimizer.exact.bounds import lower_bound as unsliced_lower_bound
from optimizer.exact.options import OBJECTIVES
from optimizer.ops import Kind, fusing_can_win, op_duration
from optimizer.problem import Problem, require_problem

Table = list[list[list[float]]]  # stage -> microbatch -> slice


def needs_general_bound(problem: Problem) -> bool:
    """Whether optimizer.exact.bounds does not apply: slices, or a stage where fusing can win."""
    tables = problem.tables()
    return problem.num_slices > 1 or any(fusing_can_win(tables, s) for s in range(problem.num_stages))


def split_relaxation(problem: Problem) -> Problem | None:
    """An unsliced problem whose bounds are bounds here: B' and W' as plain B and W (None: none such).

    The problem itself when fusing cannot win anywhere. With one slice and W' > 0 on every
    stage (BW longer than B), the relaxed problem with B' and W' and no fused gain is a
    relaxation: every schedule maps to one of it, op for op in the same order (a BW to B'
    then W', together BW long), no op ending later; where B allocates, that allocation
    moves to W', so each device's memory is never higher than in the schedule mapped from
    and every free comes no later. All of
    optimizer.exact.bounds, memory-aware heads included, and the device relaxations apply
    to it. None for sliced problems and where BW is no longer than B.
    """
    if not needs_general_bound(problem):
        return problem
    if problem.num_slices > 1:
        return None
    dur = relaxed_durations(problem)
    if any(dur[Kind.W][s][0] <= 0 for s in range(problem.num_stages)):
        return None
    data = problem.model_dump()
    for s, stage in enumerate(data["stages"]):
        stage["backward_input"], stage["backward_weight"], stage["backward"] = dur[Kind.B][s][0], dur[Kind.W][s][0], None
        # A B that allocates makes its allocation at W' instead: memory then never runs
        # higher than in the schedule mapped from (a fused BW changes it once, at its end,
        # which is W's end; a split B's allocation comes no earlier than B' ends).
        memory = stage["memory"]
        if memory["backward_input"] > 0:
            memory["backward_weight"] += memory["backward_input"]
            memory["backward_input"] = 0.0
    return Problem.model_validate(data)


def lower_bound(problem: Problem, objective: str = "makespan", deadline: float | None = None) -> LowerBound:
    """The valid lower bound for any problem (see the module doc). With a `deadline`
    (time.monotonic()) the bounds that come in parts (`cut_by_deadline`) keep the parts
    that end by it; the others ignore it. Never below one microbatch's round trip
    (`round_trip_bound`), which always comes in time."""
    require_problem(problem)
    if objective not in OBJECTIVES:
        raise InputError(f"objective: '{objective}' is not one of {', '.join(OBJECTIVES)}")
    return stronger(_lower_bound(problem, objective, deadline), round_trip_bound(problem, objective))


def stronger(first: LowerBound, second: LowerBound) -> LowerBound:
    """The higher of two bounds (the first on a tie)."""
    return second if second.value > first.value * (1 + 1e-12) else first


def round_trip_bound(problem: Problem, objective: str = "makespan") -> LowerBound:
    """The bound of the problem with one microbatch and no memory limit: any schedule's
    ops of one microbatch form a schedule of that problem, and leaving ops out never
    lengthens a device's span nor the makespan. Its cost grows with the stages only, so
    it stands where the whole bound (a pass over every stage and microbatch) is cut by a
    deadline: with more devices than microbatches the round trip is most of the span
    (p = 256, m = 32 on the V placement: 1055.2 where the busiest device's work is 166.4).
    """
    if problem.num_microbatches == 1 and problem.memory_limit is None:
        return LowerBound(0.0, "one microbatch")  # the problem itself: its own bound says more
    one = Problem.model_validate({**problem.model_dump(), "num_microbatches": 1, "memory_limit": None})
    if objective != "span":
        found = _lower_bound(one, objective, None)
        return LowerBound(found.value, f"one microbatch's round trip ({found.reason}, with one microbatch)")
    # The span: the device of stage 0 starts with its forward, on which every op of the
    # microbatch waits, so each of its ops ends within the span at its head (from that
    # forward) plus its duration. The per-device span bounds would cost a pass per device
    # (0.7 s at p = 256); this is one. Without vocabulary passes (a relaxation) and with
    # the cheaper of fused and split backwards (`split_relaxation`); none for slices.
    relaxed = split_relaxation(Problem.model_validate({**one.model_dump(), "vocab_parallel": None}))
    if relaxed is None:
        return LowerBound(0.0, "one microbatch (no round trip for token slices)")
    head, dur = heads(relaxed, memory_aware=False), durations(relaxed)
    first = relaxed.tables().device[0]
    value = max(head[kind][s][0] + dur[kind][s] for s in relaxed.stages_on(first) for kind in ("F", "B", "W"))
    return LowerBound(value, f"one microbatch's round trip on device {first} (heads from its first forward)")


def _lower_bound(problem: Problem, objective: str, deadline: float | None) -> LowerBound:
    if problem.vocab_parallel is not None:
        return vocab_lower_bound(problem, objective)
    relaxed = split_relaxation(problem)
    if relaxed is problem:
        return unsliced_lower_bound(problem, objective, deadline)
    if relaxed is not None:
        found = unsliced_lower_bound(relaxed, objective, deadline)
        return LowerBound(found.value, f"{found.reason}, backwards relaxed to the cheaper of fused and split")
    busy = busy_bound(problem)
    if objective == "span":
        return busy
    return stronger(busy, heads_and_tails_bound(problem))


def cut_by_deadline(problem: Problem) -> bool:
    """Whether `lower_bound` takes a deadline on this problem (its bound comes in parts)."""
    return problem.vocab_parallel is None and split_relaxation(problem) is not None


def relaxed_durations(problem: Problem) -> dict[str, list[list[float]]]:
    """kind -> stage -> slice: F, and the relaxed B' and W' of the module doc."""
    t = problem.tables()
    S, K = problem.num_stages, problem.num_slices
    dur: dict[str, list[list[float]]] = {kind: [[0.0] * K for _ in range(S)] for kind in (Kind.F, Kind.B, Kind.W)}
    for s in range(S):
        for k in range(K):
            b, w, bw = (op_duration(t, kind, s, k) for kind in (Kind.B, Kind.W, Kind.BW))
            dur[Kind.F][s][k] = op_duration(t, Kind.F, s, k)
            dur[Kind.B][s][k] = min(b, bw)
            dur[Kind.W][s][k] = min(bw, b + w) - min(b, bw)
    return dur


def busy_bound(problem: Problem) -> LowerBound:
    """The busiest device's work with the relaxed durations."""
    dur = relaxed_durations(problem)
    device = problem.tables().device
    work = [0.0] * problem.num_devices
    for s in range(problem.num_stages):
        work[device[s]] += problem.num_microbatches * sum(dur[kind][s][k] for kind in dur for k in range(problem.num_slices))
    value = max(work)
    return LowerBound(value, f"busy time of device {work.index(value)} (fused backward where shorter)")


def _links(problem: Problem) -> list[float]:
    device = problem.tables().device
    S = problem.num_stages
    return [problem.comm_time if s + 1 < S and device[s] != device[s + 1] else 0.0 for s in range(S)]


def _ordered_w(problem: Problem) -> list[list[bool]]:
    """stage -> slice: whether the Ws of that class run in microbatch order in some optimal schedule."""
    t = problem.tables()
    return [[not fusing_can_win(t, s, k) for k in range(problem.num_slices)] for s in range(problem.num_stages)]


def sliced_heads(problem: Problem) -> dict[str, Table]:
    """Earliest start of every op (kind -> stage -> microbatch -> slice)."""
    S, m, K = problem.num_stages, problem.num_microbatches, problem.num_slices
    dur, comm, ordered_w = relaxed_durations(problem), _links(problem), _ordered_w(problem)
    head = {kind: [[[0.0] * K for _ in range(m)] for _ in range(S)] for kind in dur}
    F, B, W = head[Kind.F], head[Kind.B], head[Kind.W]
    dF, dB, dW = dur[Kind.F], dur[Kind.B], dur[Kind.W]
    for i in range(m):
        for s in range(S):
            for k in range(K):
                h = 0.0
                if s > 0:
                    h = F[s - 1][i][k] + dF[s - 1][k] + comm[s - 1]
                if k > 0:
                    h = max(h, F[s][i][k - 1] + dF[s][k - 1])
                if i > 0:
                    h = max(h, F[s][i - 1][k] + dF[s][k])
                F[s][i][k] = h
        for s in reversed(range(S)):
            for k in reversed(range(K)):
                h = F[s][i][k] + dF[s][k] if s == S - 1 else B[s + 1][i][k] + dB[s + 1][k] + comm[s]
                if k + 1 < K:
                    h = max(h, B[s][i][k + 1] + dB[s][k + 1])
                if i > 0:
                    h = max(h, B[s][i - 1][k] + dB[s][k])
                B[s][i][k] = h
        for s in range(S):
            for k in range(K):
                h = B[s][i][k] + dB[s][k]
                if i > 0 and ordered_w[s][k]:
                    h = max(h, W[s][i - 1][k] + dW[s][k])
                W[s][i][k] = h
    return head


def sliced_tails(problem: Problem) -> dict[str, Table]:
    """Least work that must follow the end of every op (kind -> stage -> microbatch -> slice)."""
    S, m, K = problem.num_stages, problem.num_microbatches, problem.num_slices
    dur, comm, ordered_w = relaxed_durations(problem), _links(problem), _ordered_w(problem)
    tail = {kind: [[[0.0] * K for _ in range(m)] for _ in range(S)] for kind in dur}
    F, B, W = tail[Kind.F], tail[Kind.B], tail[Kind.W]
    dF, dB, dW = dur[Kind.F], dur[Kind.B], dur[Kind.W]
    for i in reversed(range(m)):
        for s in range(S):
            for k in range(K):
                W[s][i][k] = W[s][i + 1][k] + dW[s][k] if i + 1 < m and ordered_w[s][k] else 0.0
        for s in range(S):
            for k in range(K):
                q = dW[s][k] + W[s][i][k]
                if i + 1 < m:
                    q = max(q, dB[s][k] + B[s][i + 1][k])
                if k > 0:
                    q = max(q, dB[s][k - 1] + B[s][i][k - 1])
                if s > 0:
                    q = max(q, comm[s - 1] + dB[s - 1][k] + B[s - 1][i][k])
                B[s][i][k] = q
        for s in reversed(range(S)):
            for k in reversed(range(K)):
                q = dB[s][k] + B[s][i][k] if s == S - 1 else comm[s] + dF[s + 1][k] + F[s + 1][i][k]
                if k + 1 < K:
                    q = max(q, dF[s][k + 1] + F[s][i][k + 1])
                if i + 1 < m:
                    q = max(q, dF[s][k] + F[s][i + 1][k])
                F[s][i][k] = q
    return tail


def heads_and_tails_bound(problem: Problem) -> LowerBound:
    """The largest per-device preemptive one-machine bound with per-slice heads and tails."""
    value = max(jackson_preemptive(device_jobs) for device_jobs in _stage_jobs(problem))
    return LowerBound(value, "warm-up, work and cool-down per slice (heads and tails)")


def _stage_jobs(problem: Problem) -> list[list[tuple[float, float, float]]]:
    """Per device, (head, relaxed duration, tail) of every stage op."""
    dur = relaxed_durations(problem)
    head, tail = sliced_heads(problem), sliced_tails(problem)
    device = problem.tables().device
    jobs: list[list[tuple[float, float, float]]] = [[] for _ in range(problem.num_devices)]
    for kind in dur:
        for s in range(problem.num_stages):
            for i in range(problem.num_microbatches):
                for k in range(problem.num_slices):
                    jobs[device[s]].append((head[kind][s][i][k], dur[kind][s][k], tail[kind][s][i][k]))
    return jobs


def vocab_lower_bound(problem: Problem, objective: str = "makespan") -> LowerBound:
    """The best of the bound without the passes and the device bounds with them (module doc)."""
    stripped = problem.without_vocab()
    without = lower_bound(stripped, objective)
    t = problem.tables()
    m, p, last = problem.num_microbatches, problem.num_devices, problem.num_stages - 1
    passes = m * (t.vocab_forward + t.vocab_backward)
    jobs = _stage_jobs(stripped)
    work = [sum(duration for _, duration, _ in device_jobs) + passes for device_jobs in jobs]
    busiest = max(work)
    busy = LowerBound(busiest, f"busy time of device {work.index(busiest)}, vocabulary passes included")
    best = stronger(without, busy)
    if objective == "span":
        return best
    head, tail, dur = sliced_heads(stripped), sliced_tails(stripped), relaxed_durations(stripped)
    collective, s_time, t_time = t.barrier_time, t.vocab_forward, t.vocab_backward
    for j in range(m):
        forward_end = head[Kind.F][last][j][0] + dur[Kind.F][last][0]
        backward_after = dur[Kind.B][last][0] + tail[Kind.B][last][j][0]  # the last stage's backward and what follows it
        after_t = collective + backward_after if t.vocab_barriers == 2 else 0.0
        after_s = collective + max(t_time + after_t, backward_after if t.vocab_barriers == 1 else 0.0)
        for d in range(p):
            s_head = forward_end + (problem.comm_time if d != t.device[last] else 0.0)
            jobs[d].append((s_head, s_time, after_s))
            jobs[d].append((s_head + s_time + collective, t_time, after_t))
    value = max(jackson_preemptive(device_jobs) for device_jobs in jobs)
    if value > best.value * (1 + 1e-12):
        return LowerBound(value, "warm-up, work and cool-down per device, vocabulary passes included (heads and tails)")
    return best
