"""A decoder-only language model's layers file from its sizes (FLOPs and bytes, no GPU needed).

For users without a per-layer profile, and for the balance benchmark. Per microbatch of
T = batch x sequence tokens, with hidden h, vocabulary V, s the sequence length:

- transformer block: F = T (24 h^2 + 4 s h) FLOPs (the matmuls and the attention
  scores and values), B = T (24 h^2 + 8 s h) (input gradients; attention's backward has
  twice its forward's matmuls), W = T 24 h^2 (weight gradients of the matmuls only);
- head (final norm, output layer, loss): F = B = W = 2 T h V;
- embedding: a memory-bound lookup, T h values read and written at the memory bandwidth.
Times are FLOPs over the sustained rate (or bytes over the bandwidth), in milliseconds.

Memory, in GiB (bf16 activations, no recomputation; Korthikanti et al. 2022 give 34 s b h
bytes per block with flash attention, plus 5 a s^2 b without): a block's F keeps its
activations, its B frees all but what the weight gradients read (the linear layers'
inputs, 14 bytes per token and hidden unit), its W frees the rest; the head keeps fp32
logits (4 V bytes per token) and its input, B trades the logits for their bf16 gradient
(2 V bytes per token: the output layer's weight gradient reads it), W frees that and the
input. Fixed memory per layer: its parameters x `bytes_per_parameter` (18 with bf16
weights, fp32 master weights and gradients, and Adam's two moments; less with a
distributed optimizer).
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.errors import InputError
from optimizer.io import validate_model
from optimizer.layers import FORMAT, VERSION, LayersProfile

GIB = float(2**30)


@dataclass(frozen=True)
class DecoderSizes:
    blocks: int = 32
    hidden: int = 4096
    vocab: int = 32_000
    sequence: int = 4096
    batch: int = 1  # sequences per microbatch
    heads: int = 32
    flash_attention: bool = True
    tflops: float = 150.0  # sustained bf16 rate per device (about half an A100's peak)
    bandwidth_gbs: float = 1000.0  # sustained memory bandwidth, GB/s
    bytes_per_parameter: float = 18.0
    comm_ms: float = 0.0  # one activation transfer between devices

    def __post_init__(self) -> None:
        if self.heads >= 1 and self.hidden % self.heads:
            raise InputError(f"--heads: {self.heads} does not divide --hidden {self.hidden} (each head gets hidden / heads units)")


def _ms(flops: float, sizes: DecoderSizes) -> float:
    return flops / (sizes.tflops * 1e12) * 1e3


def _layer(name: str, kind: str, times: tuple[float, float, float], memory: tuple[float, float], parameters: float) -> dict:
    forward_bytes, after_b_bytes = memory  # kept by F; still kept after B (freed by W)
    return {
        "name": name,
        "kind": kind,
        "forward": times[0],
        "backward_input": times[1],
        "backward_weight": times[2],
        "memory": {
            "forward": forward_bytes / GIB,
            "backward_input": (after_b_bytes - forward_bytes) / GIB,
            "backward_weight": -after_b_bytes / GIB,
        },
        "parameters": parameters / GIB,
    }


def decoder_layers(sizes: DecoderSizes) -> LayersProfile:
    """The layers file of a decoder-only model of these sizes (see the module doc)."""
    if min(sizes.blocks, sizes.hidden, sizes.vocab, sizes.sequence, sizes.batch, sizes.heads) < 1:
        raise InputError("layers: blocks, hidden, vocab, sequence, batch and heads must be positive")
    h, V, s = sizes.hidden, sizes.vocab, sizes.sequence
    T = sizes.batch * s
    per_param = sizes.bytes_per_parameter
    block_activation = T * h * 34 + (0 if sizes.flash_attention else 5 * sizes.heads * s * T)
    block = (
        _ms(T * (24 * h * h + 4 * s * h), sizes),
        _ms(T * (24 * h * h + 8 * s * h), sizes),
        _ms(T * 24 * h * h, sizes),
    )
    lookup_ms = 2 * 2 * T * h / (sizes.bandwidth_gbs * 1e9) * 1e3  # read and write T x h bf16 values
    head_ms = _ms(2 * T * h * V, sizes)
    layers = [_layer("tok_embeddings", "embedding", (lookup_ms, lookup_ms, lookup_ms), (8.0 * T, 8.0 * T), V * h * per_param)]
    layers += [_layer(f"layers.{i}", "block", block, (block_activation, 14.0 * T * h), 12 * h * h * per_param) for i in range(sizes.blocks)]
    layers.append(_layer("output", "head", (head_ms, head_ms, head_ms), ((4 * V + 2 * h) * T, (2 * V + 2 * h) * T), V * h * per_param))
    return validate_model(
        LayersProfile,
        {"format": FORMAT, "version": VERSION, "layers": layers, "comm_time": sizes.comm_ms},
        "layers",
    )
