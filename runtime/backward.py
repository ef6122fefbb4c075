"""Backward split in two for any nn.Module: input gradients now, weight gradients later.

Zero-bubble schedules run B (the gradient for the stage input, which the previous stage
waits for) early and W (the parameter gradients, which nobody waits for) late. We split
one autograd graph without recomputing the forward:

B: walk the graph once and find the *weight frontier*: the nodes that lie on the path to
   the stage input and also have an edge into a part of the graph that leads only to
   parameters (a Linear's addmm: its mat1 edge leads to the input, its weight edge only
   to the weight). Run autograd to the stage input with the graph retained, and record
   the gradient arriving at each frontier node with a node pre-hook. Autograd computes
   only the outputs a node needs, so B skips every weight GEMM.
W: for each group of frontier nodes (nodes whose parameters overlap are grouped), start
   autograd at those nodes with the recorded gradients and stop at the group's
   parameters. Each group's call reaches only weight edges, so no activation gradient
   is computed twice; the graph is freed as W runs.

A stage whose input needs no gradient (the first stage, fed token ids) has no frontier:
B does nothing and W is the whole backward.

Several roots: a token slice's backward starts from the stage output and from its own
keys and values, which later slices' attention read (runtime/slicing.py). The roots may
sit inside one another's graphs (a slice's keys feed its own attention too); autograd
sums what reaches such a node. A root off the input path is a frontier node whose
recorded gradient is only its own root gradient: W starts there *and* from the frontier
nodes above it, and the two add up, so it is never pinned (see backward_weight).

The cost, measured by the executor benchmark: one Python walk of the graph per B and
one autograd call per parameter group per W (about 6 per transformer block). Memory: the
retained graph keeps every saved activation until W, so B frees nothing; it holds the
recorded frontier gradients (about one activation per Linear) until W.

`backward_fused` is the plain single-call backward for BW ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

# (frontier edges, their gradients, the parameters, the recorded gradients per frontier
# node when the group has several nodes; see backward_weight)
_Group = tuple[list[GradientEdge], list[torch.Tensor], list[torch.nn.Parameter], list[tuple[Node, tuple]]]


@dataclass
class WeightWork:
    """What W needs: per group, the frontier edges, their gradients and the parameters."""

    groups: list[_Group] = field(default_factory=list)

    def nbytes(self) -> int:
        seen: dict[int, int] = {}
        for _, grads, _, _ in self.groups:
            for g in grads:
                storage = g.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())


def _weight_frontier(roots: set[Node], inputs: set[Node], params: dict[Node, int]) -> tuple[dict[Node, frozenset[int]], set[Node]]:
    """The frontier nodes with the parameters each feeds, and the input path.

    One walk down from the roots records each node's parents; the input path is then
    everything above an input node, and each parameter climbs its weight-only part
    (usually a transpose or nothing) until it meets the input path.
    """
    parents: dict[Node, list[Node]] = {root: [] for root in roots}
    stack = list(roots)
    while stack:
        node = stack.pop()
        for child, _ in node.next_functions:
            if child is None:
                continue
            if child in parents:
                parents[child].append(node)
            else:
                parents[child] = [node]
                stack.append(child)

    on_input_path: set[Node] = set()
    climb = [n for n in inputs if n in parents]
    while climb:
        node = climb.pop()
        if node not in on_input_path:
            on_input_path.add(node)
            climb.extend(parents[node])

    frontier: dict[Node, set[int]] = {}
    for param_node, index in params.items():
        if param_node not in parents:
            continue  # unused in this forward
        seen = {param_node}
        climb = [param_node]
        while climb:
            node = climb.pop()
            if node in on_input_path:
                frontier.setdefault(node, set()).add(index)
                continue
            if node in roots:  # a root that misses the input is frontier
                frontier.setdefault(node, set()).add(index)
            for parent in parents[node]:
                if parent not in seen:
                    seen.add(parent)
                    climb.append(parent)
    return {node: frozenset(ids) for node, ids in frontier.items()}, on_input_path


def _group(frontier: dict[Node, frozenset[int]]) -> list[tuple[list[Node], set[int]]]:
    """Merge frontier nodes that share parameters: each parameter's W is one call."""
    groups: list[tuple[list[Node], set[int]]] = []
    owner: dict[int, int] = {}
    for node, reached in frontier.items():
        hits = sorted({owner[p] for p in reached if p in owner})
        if not hits:
            groups.append(([node], set(reached)))
            target = len(groups) - 1
        else:
            target = hits[0]
            groups[target][0].append(node)
            groups[target][1].update(reached)
            for other in hits[1:]:
                nodes, params = groups[other]
                groups[target][0].extend(nodes)
                groups[target][1].update(params)
                groups[other] = ([], set())
        for p in groups[target][1]:
            owner[p] = target
    return [g for g in groups if g[0]]


class SplitBackward:
    """The B half of a stage's backward; W is `backward_weight` on what B returns.

    It keeps each parameter's gradient-accumulator node alive (as DDP does), so every
    microbatch's graph reuses the same node and the lookup costs nothing per call.
    """

    def __init__(self, params: Sequence[torch.nn.Parameter]):
        self.params = [p for p in params if p.requires_grad]
        self._param_nodes = {get_gradient_edge(p).node: i for i, p in enumerate(self.params)}

    def backward_input(
        self,
        outputs: torch.Tensor | Sequence[torch.Tensor],
        grad_output: torch.Tensor | Sequence[torch.Tensor | None] | None,
        inputs: Sequence[torch.Tensor],
    ) -> tuple[list[torch.Tensor | None], WeightWork]:
        """Gradients for `inputs` (None where an input needs none) and the work W will do.

        `outputs` is one tensor or several roots, with one gradient each (None: ones).
        """
        roots = _roots(outputs, grad_output)
        grad_inputs: list[torch.Tensor | None] = [None] * len(inputs)
        if not roots:
            return grad_inputs, WeightWork()
        needs_grad = [i for i, x in enumerate(inputs) if x.requires_grad]
        if not needs_grad:
            # Nothing upstream waits: W does the whole backward from the roots.
            edges = [GradientEdge(root.node, root.tensor.output_nr) for root in roots]
            return grad_inputs, WeightWork([(edges, [root.grad for root in roots], self.params, [])])
        input_nodes = {get_gradient_edge(inputs[i]).node for i in needs_grad}
        frontier, on_input_path = _weight_frontier({root.node for root in roots}, input_nodes, self._param_nodes)

        # A root off the input path is not run by B: its gradient is the root's own.
        given: dict[Node, list[torch.Tensor | None]] = {}
        for root in roots:
            if root.node not in on_input_path:
                slots = given.setdefault(root.node, [])
                nr = root.tensor.output_nr
                slots.extend([None] * (nr + 1 - len(slots)))
                current = slots[nr]
                slots[nr] = root.grad if current is None else current + root.grad
        recorded: dict[Node, tuple] = {node: tuple(slots) for node, slots in given.items()}
        handles = []
        try:
            for node in frontier:
                if node not in recorded:
                    handles.append(node.register_prehook(lambda grads, node=node: recorded.__setitem__(node, grads)))
            on_path = [root for root in roots if root.node in on_input_path]
            if on_path:
                found = torch.autograd.grad(
                    [root.tensor for root in on_path],
                    [inputs[i] for i in needs_grad],
                    [root.grad for root in on_path],
                    retain_graph=True,
                    allow_unused=True,
                )
                for i, g in zip(needs_grad, found):
                    grad_inputs[i] = g
        finally:
            for handle in handles:
                handle.remove()

        work = WeightWork()
        for nodes, param_ids in _group(frontier):
            edges, edge_grads = [], []
            for node in nodes:
                for i, g in enumerate(recorded.get(node, ())):
                    if g is not None:
                        edges.append(GradientEdge(node, i))
                        edge_grads.append(g)
            if edges:
                pinned = [node for node in nodes if node in recorded and node not in given]
                clamps = [(node, recorded[node]) for node in pinned] if len(nodes) > 1 else []
                work.groups.append((edges, edge_grads, [self.params[i] for i in sorted(param_ids)], clamps))
        return grad_inputs, work


class _Root(NamedTuple):
    tensor: torch.Tensor
    node: Node  # its grad_fn
    grad: torch.Tensor


def _roots(outputs: torch.Tensor | Sequence[torch.Tensor], grad_output: torch.Tensor | Sequence[torch.Tensor | None] | None) -> list[_Root]:
    """The roots that have a graph, each with its gradient (ones where None is given)."""
    if isinstance(outputs, torch.Tensor):
        assert grad_output is None or isinstance(grad_output, torch.Tensor), "one root, one gradient"
        pairs: list[tuple[torch.Tensor, torch.Tensor | None]] = [(outputs, grad_output)]
    else:
        assert not isinstance(grad_output, torch.Tensor) and grad_output is not None, "one gradient per root"
        pairs = list(zip(outputs, grad_output, strict=True))
    return [_Root(t, t.grad_fn, torch.ones_like(t) if g is None else g) for t, g in pairs if t.grad_fn is not None]


def backward_weight(work: WeightWork) -> None:
    """Accumulate the parameter gradients of one microbatch into `.grad`; frees the graph."""
    # A group whose nodes sit one above another re-runs the input-path nodes between
    # them, which other groups' calls may have freed; keep buffers until W ends then.
    retain = any(clamps for _, _, _, clamps in work.groups)
    for edges, grads, params, clamps in work.groups:
        # A parameter used in two places can put one frontier node downstream of another
        # in the same group; pinning each node's gradient to the recorded one keeps the
        # second from adding to the first (rare: shared weights inside one stage).
        handles = [node.register_prehook(lambda _, grads=grads: grads) for node, grads in clamps]
        try:
            found = torch.autograd.grad(edges, params, grads, retain_graph=retain, allow_unused=True)
        finally:
            for handle in handles:
                handle.remove()
        for p, g in zip(params, found):
            if g is None:
                continue
            if p.grad is None:
                p.grad = g
            else:
                p.grad += g
    work.groups.clear()


def backward_fused(
    outputs: torch.Tensor | Sequence[torch.Tensor],
    grad_output: torch.Tensor | Sequence[torch.Tensor | None] | None,
    inputs: Sequence[torch.Tensor],
) -> list[torch.Tensor | None]:
    """Input and parameter gradients in one autograd call (the BW op); roots as in B."""
    roots = _roots(outputs, grad_output)
    if not roots:
        return [None] * len(inputs)
    torch.autograd.backward([root.tensor for root in roots], [root.grad for root in roots])
    found = []
    for x in inputs:
        found.append(x.grad if x.requires_grad else None)
        x.grad = None
    return found
