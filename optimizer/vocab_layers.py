"""Vocabulary parallelism for a layers file: the embedding and the head sharded over all devices.

With vocabulary parallelism (README, "The problem and its rules") the input embedding and
the head (final norm, output layer, loss) belong to no stage: every one of the p devices
holds 1/p of their vocabulary rows. A layers file then splits into two parts:

- the **trunk**, the transformer blocks: the layers a split hands to stages;
- the **passes** S and T that every device runs per microbatch for its shard of the head.
  The head's output layer is linear in the vocabulary, so a shard costs 1/p of the head's
  times. With two barriers S is the shard's forward (logits and softmax statistics) and T
  its backward (input and weight gradients, fused when the layers file says fusing is
  cheaper); with one barrier S also forms the shard's part of the input gradient, so S
  takes F + B and T only W. From S's start to T's end a device holds 1/p of the head's
  peak over its forward and backward (the forward's memory, more where its B
  allocates). A layers file does not say how much of the head's memory is its input,
  which every device holds whole (h values per token, beside V/p logits per token: at
  h = 4096, p = 8 half the shard's logits at V = 32k, a tenth at 128k, 6 % at 256k): it
  is counted as sharded, so the passes' memory is an underestimate by that much.
  Each collective takes the layers file's `comm_time` (one activation transfer), for
  either barrier count: the one-barrier collective also carries each shard's part of the
  input gradient, so where transfers are slow that choice is favoured more than it
  should be; set `vocab_parallel.barrier_time` in a problem by hand where it matters.

On every device 1/p of the embedding's and the head's parameter state stays for the
whole step. The embedding's lookup is memory-bound and runs for all microbatches before
and after the pipeline (the executor's design), so its time is not part of the schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.errors import InputError
from optimizer.layers import Layer, LayersProfile
from optimizer.problem import VocabParallel

BARRIER_CHOICES = (1, 2)


@dataclass(frozen=True)
class VocabSharding:
    """The head's passes per device and the vocabulary layers' fixed memory on every device."""

    passes: VocabParallel
    held_per_device: float  # parameters, gradients and optimizer state of the shards

    @property
    def barriers(self) -> int:
        return self.passes.barriers


def _fused(layer: Layer) -> float:
    split = layer.backward_input + layer.backward_weight
    return min(split, layer.backward) if layer.backward is not None else split


def shard_vocabulary(profile: LayersProfile, num_devices: int, barriers: int) -> tuple[LayersProfile, VocabSharding]:
    """The trunk to split into stages, and the passes and fixed memory of the sharded layers."""
    kinds = [layer.kind for layer in profile.layers]
    if "head" not in kinds:
        raise InputError("--vocab-parallel: the layers file has no head layer (kind 'head': final norm, output layer and loss) to shard")
    if barriers not in BARRIER_CHOICES:
        raise InputError(f"--vocab-barriers: {barriers} barriers; vocabulary parallelism has 1 or 2 per microbatch")
    trunk_layers = [layer for layer in profile.layers if layer.kind == "block"]
    if not trunk_layers:
        raise InputError("--vocab-parallel: the layers file has no blocks left for the stages once the embedding and head are sharded")
    head = profile.layers[kinds.index("head")]
    embedding = profile.layers[0] if kinds[0] == "embedding" else None
    if barriers == 2:
        forward, backward = head.forward, _fused(head)
    else:
        forward, backward = head.forward + head.backward_input, head.backward_weight
    # The passes run the shard's F, B and W between them: the most they hold is after F or after B.
    held_by_pass = max(head.memory.forward, head.memory.forward + head.memory.backward_input)
    passes = VocabParallel.model_validate(
        {
            "barriers": barriers,
            "forward": forward / num_devices,
            "backward": backward / num_devices,
            "memory": held_by_pass / num_devices,
            "barrier_time": profile.comm_time,
        }
    )
    held = (head.parameters + (embedding.parameters if embedding is not None else 0.0)) / num_devices
    trunk = profile.model_copy(update={"layers": trunk_layers})
    return trunk, VocabSharding(passes, held)
