"""Room for the next chunk: a device under a memory limit cannot run far ahead on its first chunk.

On a device with several stages (V, interleaved), take a forward F(s, i) and a higher
stage s' > s of the same device. Say it starts at time x, and let j be the first
microbatch whose forward of s' has not started by x. Microbatches j..i have all started
their forwards of the device's stages up to s (L, the "low" stages: the forward chain and
each stage's microbatch order, optimizer.exact.canonical), and none of them can free any
of it before its own F(s', .) has run (a backward of a stage in L comes after the
forward of every later stage), which is no earlier than F(s', j). So until F(s', j)
starts, the device holds at least (i - j + 1) * sum_L alloc, and F(s', j) still has to
allocate alloc(s') on top: every valid schedule finishes, so

    (i - j + 1) * sum_L alloc + alloc(s') <= limit,  i.e.  i - j + 1 <= K(s, s')

with K = floor((limit - alloc(s')) / sum_L alloc). Hence F(s', i - K) has started, and
(one op at a time on the device) ended, before F(s, i) starts: a precedence with a lag
of K microbatches that holds in every valid schedule, even though no dependency links
the two ops. With it the forwards of s' of microbatches up to i - K are known to have
allocated too, which the memory argument of optimizer.exact.bounds.heads then counts.

K >= 1 whenever one microbatch fits (the problem's smallest limit holds every stage of a
device for one microbatch), so the lag points to an earlier microbatch. At V-Min's memory
on the V placement (limit (p+4)//3 activations, half of one per chunk) device 0 can run
the first chunk of at most 2*limit - 1 microbatches ahead of the second chunk: the wait
for the second chunk's forward, a whole trip through the other devices, then counts.
"""

from __future__ import annotations

import math

from optimizer.problem import Problem

# Float sums of memory sizes: a lag is taken one microbatch longer when the division
# lands within this share of an integer, never shorter.
SLACK = 1e-9


def lags(problem: Problem) -> list[list[tuple[int, int]]]:
    """Per stage s: (s', K) for each higher stage s' of its device (see the module doc).

    Empty lists without a limit on the device, or where forwards do not allocate (the
    argument needs allocations by forwards and frees by B and W only).
    """
    t = problem.tables()
    S = problem.num_stages
    result: list[list[tuple[int, int]]] = [[] for _ in range(S)]
    if any(v < 0 for v in t.mem_forward) or any(v > 0 for v in t.mem_backward_input + t.mem_backward_weight):
        return result
    for s in range(S):
        limit = t.limit[t.device[s]]
        if math.isinf(limit):
            continue
        stages = problem.stages_on(t.device[s])
        low = sum(t.mem_forward[s3] for s3 in stages if s3 <= s)
        if low <= 0:
            continue
        for higher in stages:
            if higher > s:
                ratio = (limit - t.mem_forward[higher]) / low
                result[s].append((higher, max(1, math.floor(ratio + SLACK * max(1.0, abs(ratio))))))
    return result
