"""Models the executor can run: the built-in `example` GPT, or a user's `module:function`.

A pipeline model is a list of stage modules (stage s maps stage s-1's output to its own
output; the first takes the batch inputs, the last returns what the loss takes), a loss
function, and a deterministic batch maker. Every rank builds it the same way and keeps
its own stages, so stage weights agree across ranks without any broadcast.

The `example` model is a small GPT-style decoder in the spirit of nanoGPT: token and
position embeddings in the first stage, pre-norm transformer blocks split over the
stages by layer counts, final norm and LM head in the last stage; random tokens from a
fixed seed, no downloads.

Model names on the command line:

    example                                   default configuration, layers split evenly
    example:layers=8,hidden=128,split=1/3/3/1  any GPTConfig field, and the layers per stage
    synthetic[:width=16,mib_per_unit=1,problem=PATH]  sleeping stages with a problem's
                                              op times in ms (runtime/synthetic.py)
    package.module:build_stages                a user model (see `PipelineModel`)
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn as nn
import torch.nn.functional as F

from optimizer.errors import InputError
from optimizer.formats.example_split import blocks_per_stage
from optimizer.problem import Problem, load_problem
from optimizer.split import spread_evenly
from runtime.slicing import SliceCache, causal_mask

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
BatchFn = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class PipelineModel:
    """What a user's `build_stages(num_stages)` returns.

    - `stages`: one nn.Module per pipeline stage, in forward order. Stage s takes the
      tensor stage s-1 returned (stage 0 takes the batch inputs) and returns one tensor.
    - `loss_fn(last stage output, targets)`: a scalar mean loss over the microbatch.
    - `make_batch(step, num_microbatches)`: (inputs, targets) of one training step, the
      first dimension holding `num_microbatches` equal microbatches. Deterministic: every
      rank calls it and must get the same tensors.

    `build_stages` is called on every rank (and once more for `--check`'s reference), so
    it must build identical weights each time: seed inside it.
    """

    stages: Sequence[nn.Module]
    loss_fn: LossFn
    make_batch: BatchFn
    vocabulary: Callable[[], VocabularyStages] | None = None  # for vocabulary-parallel schedules


@dataclass
class VocabularyStages:
    """What a model offers to run vocabulary-parallel schedules: its stages without the
    token embedding and the output layer, which then run sharded over every device
    (runtime/vocab.py), and those two weights.

    - `stages`: as `PipelineModel.stages`, but stage 0 takes the token embeddings
      (microbatch x tokens x hidden, floating point) and the last stage returns the
      hidden states the output layer takes (after the final norm).
    - `embedding`, `head`: the token embedding and the bias-free output layer weights,
      vocabulary x hidden each. The loss is then the mean softmax cross-entropy of the
      logits h head^T, whatever `loss_fn` says.
    - `embedding_name`, `head_name`: the names of these weights among the first and the
      last stage's parameters in `PipelineModel.stages`, where `--check`'s reference finds
      their gradients.
    """

    stages: Sequence[nn.Module]
    embedding: torch.Tensor
    head: torch.Tensor
    embedding_name: str
    head_name: str


# ---------------------------------------------------------------------------- the example GPT


@dataclass(frozen=True)
class GPTConfig:
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    vocab: int = 256
    seq_len: int = 32
    batch_size: int = 2  # sequences per microbatch
    seed: int = 0


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)
        self.proj = nn.Linear(config.hidden, config.hidden)

    def forward(self, x: torch.Tensor, cache: SliceCache | None = None) -> torch.Tensor:
        """Causal attention of `x`'s tokens; with a cache, also to the earlier slices' tokens."""
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            k, v = cache.extend(k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(t, k.shape[2], x.device))
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.hidden, 4 * config.hidden)
        self.proj = nn.Linear(4 * config.hidden, config.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.hidden)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.hidden)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cache: SliceCache | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), cache)
        return x + self.mlp(self.ln2(x))


class GPTStage(nn.Module):
    """A part of the GPT: embeddings if first, `num_layers` blocks, norm and head if last.

    It runs token slices (runtime/slicing.py): `cache` gives the slice's first position
    and the earlier slices' keys and values; None runs whole sequences.
    """

    token_slices = True

    def __init__(self, config: GPTConfig, num_layers: int, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        self.vocabulary_outside = False  # the embedding and head run sharded elsewhere
        if first:
            self.tok_emb = nn.Embedding(config.vocab, config.hidden)
            self.pos_emb = nn.Embedding(config.seq_len, config.hidden)
        self.blocks = nn.ModuleList(Block(config) for _ in range(num_layers))
        if last:
            self.ln_f = nn.LayerNorm(config.hidden)
            self.head = nn.Linear(config.hidden, config.vocab, bias=False)

    def forward(self, x: torch.Tensor, cache: SliceCache | None = None) -> torch.Tensor:
        if self.first:
            start = cache.start if cache is not None else 0
            positions = torch.arange(start, start + x.shape[1], device=x.device)
            x = (x if self.vocabulary_outside else self.tok_emb(x)) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x, cache)
        if self.last:
            x = self.ln_f(x)
            if not self.vocabulary_outside:
                x = self.head(x)
        return x

    def remove_vocabulary(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Drop the token embedding and the output layer; returns their weights (None where absent)."""
        self.vocabulary_outside = True
        embedding = self.tok_emb.weight.detach() if self.first else None
        head = self.head.weight.detach() if self.last else None
        for name in ("tok_emb", "head"):
            self._modules.pop(name, None)
        return embedding, head


def gpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def even_split(layers: int, num_stages: int) -> list[int]:
    """Layers per stage as even as possible; the extra layers go to the middle stages,
    since the first and last stages already carry the embeddings and the head."""
    return spread_evenly(layers, num_stages)


def build_example(config: GPTConfig, num_stages: int, split: list[int] | None = None) -> PipelineModel:
    """The example GPT cut into `num_stages` stages with `split[s]` blocks in stage s."""
    split = split if split is not None else even_split(config.layers, num_stages)
    if len(split) != num_stages:
        raise InputError(f"model: split has {len(split)} stages, the pipeline {num_stages}")
    if sum(split) != config.layers:
        raise InputError(f"model: split {'/'.join(map(str, split))} sums to {sum(split)}, not layers={config.layers}")
    # The first stage holds the embeddings and the last the head, so they may hold no block.
    if any(count < 1 for s, count in enumerate(split) if 0 < s < num_stages - 1) or (num_stages == 1 and split[0] < 1):
        raise InputError(f"model: every middle stage needs at least one layer (split {'/'.join(map(str, split))}, {num_stages} stages)")
    if config.hidden % config.heads:
        raise InputError(f"model: hidden={config.hidden} is not a multiple of heads={config.heads}")
    stages = []
    for s, count in enumerate(split):
        # Seed each stage on its own so any rank builds identical weights for it.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed * 100_003 + s)
            stages.append(GPTStage(config, count, first=s == 0, last=s == num_stages - 1))

    def make_batch(step: int, num_microbatches: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
        shape = (num_microbatches * config.batch_size, config.seq_len + 1)
        tokens = torch.randint(config.vocab, shape, generator=generator)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def vocabulary() -> VocabularyStages:
        # The same stages built again (same seeds, same weights), without the vocabulary layers.
        rebuilt = [stage for stage in build_example(config, num_stages, split).stages if isinstance(stage, GPTStage)]
        removed = [stage.remove_vocabulary() for stage in rebuilt]
        embedding, head = removed[0][0], removed[-1][1]
        assert embedding is not None and head is not None
        return VocabularyStages(rebuilt, embedding, head, "tok_emb.weight", "head.weight")

    return PipelineModel(stages, gpt_loss, make_batch, vocabulary)


def vocabulary_stages(model: PipelineModel, name: str, source: str) -> VocabularyStages:
    """The model's stages for a vocabulary-parallel schedule; refuses a model that offers none."""
    if model.vocabulary is None:
        raise InputError(f"model: {name} offers no vocabulary-sharded output layer (PipelineModel.vocabulary), which {source} needs")
    offered = model.vocabulary()
    if offered.embedding.dim() != 2 or offered.head.shape != offered.embedding.shape:
        raise InputError(f"model: {name}'s vocabulary weights must both be vocabulary x hidden")
    return offered


# ---------------------------------------------------------------------------- by name


# The example model is for trying pipesched out on CPUs: options beyond these would not
# fit a machine's memory (weights or one microbatch's activations, float32).
EXAMPLE_MAX_OPTION = 1_000_000
EXAMPLE_MAX_NUMBERS = 500_000_000


def _parse_example(options: str) -> tuple[GPTConfig, list[int] | None]:
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    values: dict[str, int] = {}
    split = None
    seen: set[str] = set()
    for item in filter(None, options.split(",")):
        key, _, value = item.partition("=")
        key = key.strip()
        if key in seen:
            raise InputError(f"model: option {key} is given twice")
        seen.add(key)
        if key == "split":
            try:
                split = [int(part) for part in value.split("/")]
            except ValueError:
                raise InputError(f"model: split '{value}' is not layer counts like 1/3/3/1") from None
            if min(split) < 0 or sum(split) < 1:
                raise InputError(f"model: split '{value}' needs layer counts of 0 or more, at least one layer in all")
            continue
        if key not in fields:
            raise InputError(f"model: unknown option '{key}' (known: {', '.join(sorted(fields))}, split)")
        try:
            values[key] = int(value)
        except ValueError:
            raise InputError(f"model: option {key}='{value}' is not an integer") from None
        if values[key] < (0 if key == "seed" else 1):
            raise InputError(f"model: option {key}={value} must be {'0 or more' if key == 'seed' else 'positive'}")
        if values[key] > EXAMPLE_MAX_OPTION:
            raise InputError(f"model: option {key}={value} is more than the {EXAMPLE_MAX_OPTION} the example model takes")
    if split is not None and "layers" not in values:
        values["layers"] = sum(split)  # checked as if given: a split's sum is no free pass
        if values["layers"] > EXAMPLE_MAX_OPTION:
            raise InputError(
                f"model: split adds up to {values['layers']} layers, more than the {EXAMPLE_MAX_OPTION} the example model takes"
            )
    config = GPTConfig(**values)
    weights = config.layers * 12 * config.hidden**2 + 2 * config.vocab * config.hidden
    activations = config.layers * config.batch_size * config.seq_len * config.hidden
    if max(weights, activations) > EXAMPLE_MAX_NUMBERS:
        raise InputError(
            f"model: the example model so configured holds about {max(weights, activations):.3g} numbers, "
            f"more than the {EXAMPLE_MAX_NUMBERS:.0e} it builds (make layers, hidden, vocab, seq_len or batch_size smaller)"
        )
    return config, split


def model_layers(name: str) -> tuple[str, list[tuple[str, str]]]:
    """The model cut one layer per stage, and each layer's (name, kind), for a per-layer profile.

    The example model: its embeddings, each block and its head (final norm and output
    layer) as stages of their own. A user model lists its layers with a function
    `pipeline_layers()` next to its `build_stages`, returning (name, kind) pairs in
    forward order, kind one of embedding, block, head; its `build_stages(n)` is then
    called with n = the number of layers and must give one stage per layer.
    """
    if name == "example" or name.startswith("example:"):
        config, _ = _parse_example(name.partition(":")[2])
        options = [item for item in name.partition(":")[2].split(",") if item and not item.strip().startswith("split=")]
        options.append("split=" + "/".join(["0"] + ["1"] * config.layers + ["0"]))
        layers = [("embedding", "embedding")] + [(f"blocks.{i}", "block") for i in range(config.layers)] + [("head", "head")]
        return "example:" + ",".join(options), layers
    module_name, _, function_name = name.partition(":")
    if not module_name or not function_name or name.startswith("synthetic"):
        raise InputError(f"model: a per-layer profile needs the example model or a user model 'package.module:function', not '{name}'")
    module = import_user_module(module_name)
    listing = getattr(module, "pipeline_layers", None)
    if not callable(listing):
        raise InputError(f"model: a per-layer profile needs '{module_name}.pipeline_layers()' listing (name, kind) of each layer")
    try:
        layers = [(str(layer_name), str(kind)) for layer_name, kind in listing()]
    except Exception as exc:
        raise InputError(f"model: {module_name}.pipeline_layers() raised {_describe(exc)}") from exc
    return name, layers


def example_config(name: str) -> GPTConfig:
    """The GPT configuration an `example[:options]` model name asks for."""
    return _parse_example(name.partition(":")[2])[0]


def import_user_module(module_name: str) -> ModuleType:
    """The user's model module, found on sys.path or else in the current folder (as
    `python -m` finds a module there; the console command does not put the folder on the
    path). The folder is searched last, so a file there never shadows an installed module.

    The user's code may fail in any way; the error names the model and keeps the
    exception as its cause, for `--debug` to show the traceback."""
    folder = os.getcwd()
    added = folder not in sys.path
    if added:
        sys.path.append(folder)
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"model: cannot import '{module_name}' ({exc}; looked on sys.path and in {folder})") from exc
    except (Exception, SystemExit) as exc:  # a syntax error, an exception or sys.exit() while it runs
        raise InputError(f"model: cannot import '{module_name}' ({_describe(exc)})") from exc
    finally:
        if added:
            sys.path.remove(folder)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):  # its code would otherwise become the command's exit status
        return f"it called sys.exit({exc.code!r})"
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} ({exc.filename}, line {exc.lineno})"
    text = str(exc).strip()
    return f"{exc.__class__.__name__}: {text.splitlines()[0]}" if text else exc.__class__.__name__


def load_model(name: str, num_stages: int, problem: Problem | None = None) -> PipelineModel:
    """Build the named model cut into `num_stages` stages (see the module docstring).

    `problem` is the schedule's problem, whose op times the synthetic model spends
    unless its `problem=PATH` option names another.
    """
    if name == "example" or name.startswith("example:"):
        config, split = _parse_example(name.partition(":")[2])
        chosen = blocks_per_stage(problem) if problem is not None else None
        if chosen is not None:
            # The schedule was solved with its layer split: run that split.
            if split is not None and split != chosen:
                raise InputError(
                    f"model: split={'/'.join(map(str, split))} differs from the schedule's layer split {'/'.join(map(str, chosen))}"
                )
            given = {item.partition("=")[0].strip() for item in name.partition(":")[2].split(",")}
            if "layers" in given and config.layers != sum(chosen):
                raise InputError(f"model: layers={config.layers} differs from the schedule's layer split ({sum(chosen)} blocks)")
            split, config = chosen, dataclasses.replace(config, layers=sum(chosen))
        return build_example(config, num_stages, split)
    if name == "synthetic" or name.startswith("synthetic:"):
        from runtime.synthetic import build_synthetic, parse_options

        synthetic, problem_path = parse_options(name.partition(":")[2])
        if problem_path is not None:
            timed_by = load_problem(problem_path)
            # Its op times are looked up per slice: a schedule of more slices than the
            # problem has failed inside the ranks (IndexError), after they had started.
            if problem is not None and timed_by.num_slices != problem.num_slices:
                raise InputError(
                    f"model: synthetic:problem={problem_path} has {timed_by.num_slices} token slice(s) per microbatch, "
                    f"the schedule {problem.num_slices}"
                )
            problem = timed_by
        if problem is None:
            raise InputError("model: synthetic needs a problem: run takes the schedule's, profile needs synthetic:problem=PATH")
        return build_synthetic(synthetic, problem, num_stages)
    module_name, _, function_name = name.partition(":")
    if not module_name or not function_name:
        raise InputError(f"model: '{name}' is neither 'example[:options]' nor 'package.module:function'")
    module = import_user_module(module_name)
    build = getattr(module, function_name, None)
    if not callable(build):
        raise InputError(f"model: '{module_name}' has no function '{function_name}'")
    try:
        built = build(num_stages)
    except (Exception, SystemExit) as exc:
        raise InputError(f"model: {name}({num_stages}) raised {_describe(exc)}") from exc
    return _checked_model(built, name, num_stages)


def _checked_model(built: object, name: str, num_stages: int) -> PipelineModel:
    """What a user's `build_stages` returned, as a PipelineModel, or one line saying what
    is wrong with it (the executor would otherwise fail inside the ranks)."""
    if isinstance(built, tuple) and len(built) == 3:
        built = PipelineModel(*built)
    if not isinstance(built, PipelineModel):
        raise InputError(f"model: {name} must return a PipelineModel or (stages, loss_fn, make_batch), not {type(built).__name__}")
    try:
        stages = list(built.stages)
    except TypeError:
        stages = None
    if stages is None or not all(isinstance(stage, nn.Module) for stage in stages):
        raise InputError(f"model: {name} returned stages that are not a list of torch.nn.Module")
    if len(stages) != num_stages:
        raise InputError(f"model: {name} returned {len(stages)} stages, the schedule has {num_stages}")
    for field in ("loss_fn", "make_batch"):
        if not callable(getattr(built, field)):
            raise InputError(f"model: {name} returned a {field} that is not callable")
    return dataclasses.replace(built, stages=stages)
