"""The runtime: run a schedule with torch.distributed, and profile a model into a problem.

- `models`: the example GPT and user models, cut into stages.
- `backward`: a stage's backward split into B (input gradient) and W (weight gradients).
- `stage`: one stage's F, B, W and BW for a microbatch.
- `plan`: a schedule checked against the world, with the message order every rank shares.
- `comm`: this rank's point-to-point transfers in that order.
- `executor`: one rank running its device's ops.
- `vocab`, `vocab_runner`, `collectives`: the vocabulary-sharded output layer, loss and
  embedding, one rank's shard with its collectives, and the order they are issued in.
- `session`: model, plan, transfers and optimizer wired for one rank.
- `check`: `--check`'s single-process reference.
- `memory`, `profile`: per-op memory and time measurements, and the problem they make.
- `launch`, `forkserver`, `worker`: starting the ranks and what each does for `run`.
- `cli`: the `pipesched` entry point with `run` and `profile`.
"""
