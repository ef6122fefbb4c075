"""Megatron's `--pipeline-model-parallel-layout` string for a schedule's layer split.

Megatron cannot take an op order; what it takes from an optimizer is the layout: which
layers each pipeline chunk holds. Its grammar (Megatron-Core's custom pipeline layout):
stages separated by `|`, in chunk order, chunk i on rank i mod PP as virtual stage
i // PP; `E` embedding, `t` transformer layer, `m` MTP layer, `L` loss (with the output
layer); `x*N` repeats a symbol and `(...)*N` a group; commas are cosmetic; a stage may
be empty. `parse_layout` reads that grammar back (tests check every export with it).
"""

from __future__ import annotations

import re

from optimizer.errors import InputError
from optimizer.formats import ScheduleFormat, missing_split
from optimizer.layers import LAYOUT_LETTER
from optimizer.problem import Problem
from optimizer.schedule import Schedule


def _run(letter: str, count: int) -> str:
    return letter if count == 1 else f"{letter}*{count}"


def stage_layout(kinds: list[str]) -> str:
    """One stage's symbols, runs of a symbol written `x*N`."""
    letters = [LAYOUT_LETTER[kind] for kind in kinds]
    parts, k = [], 0
    while k < len(letters):
        j = k
        while j < len(letters) and letters[j] == letters[k]:
            j += 1
        parts.append(_run(letters[k], j - k))
        k = j
    return "".join(parts)


def layout_for(problem: Problem) -> str:
    """The layout string of a problem whose stages record their layers (a split's problem)."""
    p = problem.num_devices
    if problem.vocab_parallel is not None:
        raise InputError(
            "format: megatron-layout places the embedding (E) and the loss (L) on stages; this schedule shards them "
            "over every device (vocabulary parallelism), which the layout cannot express: export example-split or run it with pipesched run"
        )
    for s, stage in enumerate(problem.stages):
        if stage.layers is None:
            raise missing_split("megatron-layout", s)
        if stage.device != s % p:
            raise InputError(
                f"format: megatron-layout puts chunk i on rank i mod {p}; stage {s} runs on device "
                f"{stage.device} ({problem.placement()} placement): Megatron cannot express it"
            )
    text = "|".join(stage_layout([layer.kind for layer in stage.layers or []]) for stage in problem.stages)
    try:
        parse_layout(text, p)  # Megatron's own rules: a split without its embedding or loss fails them
    except InputError as error:
        raise InputError(f"format: megatron-layout '{text}' breaks Megatron's rules ({error})") from None
    return text


def write(schedule: Schedule) -> str:
    return layout_for(schedule.problem) + "\n"


# ------------------------------------------------------------------------------ reading

_TOKEN = re.compile(r"\(|\)\*(\d+)|[EtmL|]\*(\d+)|[EtmL|]")


def expand_layout(text: str) -> str:
    """The layout with commas dropped and every repetition written out."""
    text = text.replace(",", "")
    stack: list[list[str]] = [[]]
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise InputError(f"layout: unexpected {text[position]!r} at position {position}")
        token = match.group(0)
        if token == "(":
            stack.append([])
        elif token.startswith(")"):
            if len(stack) == 1:
                raise InputError(f"layout: ')' without '(' at position {position}")
            group = "".join(stack.pop())
            stack[-1].append(group * int(match.group(1)))
        elif match.group(2) is not None:
            stack[-1].append(token[0] * int(match.group(2)))
        else:
            stack[-1].append(token)
        position = match.end()
    if len(stack) != 1:
        raise InputError("layout: '(' without ')'")
    return "".join(stack[0])


def parse_layout(text: str, pipeline_size: int, num_layers: int | None = None) -> list[str]:
    """Each stage's symbols, checked as Megatron checks a layout; InputError naming the rule broken."""
    stages = expand_layout(text).split("|")
    if len(stages) % pipeline_size:
        raise InputError(f"layout: {len(stages)} stages is not a multiple of the pipeline size {pipeline_size}")
    flat = "".join(stages)
    for symbol, where in (("E", 0), ("L", len(flat) - 1)):
        if flat.count(symbol) != 1:
            raise InputError(f"layout: '{symbol}' appears {flat.count(symbol)} times, Megatron needs it once")
        if flat.index(symbol) != where:
            raise InputError(f"layout: '{symbol}' must be the {'first' if where == 0 else 'last'} layer")
    if num_layers is not None and flat.count("t") != num_layers:
        raise InputError(f"layout: {flat.count('t')} transformer layers, the model has {num_layers}")
    return stages


FORMAT = ScheduleFormat("megatron-layout", "Megatron's --pipeline-model-parallel-layout string of the layer split", ".layout.txt", write)
