"""torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK), read and checked without torch.

Checked before anything heavy starts, so that a wrong variable is one line naming it.
"""

from __future__ import annotations

import os

from optimizer.errors import InputError


def under_torchrun() -> bool:
    """Whether torchrun started this process: RANK and WORLD_SIZE both set (one alone is refused)."""
    rank, world = "RANK" in os.environ, "WORLD_SIZE" in os.environ
    if rank != world:
        given, missing = ("RANK", "WORLD_SIZE") if rank else ("WORLD_SIZE", "RANK")
        raise InputError(f"{given}: set without {missing} (torchrun sets both; unset {given} to start every rank here)")
    return rank


def environment_int(name: str, default: int | None = None) -> int:
    text = os.environ.get(name)
    if text is None and default is not None:
        return default
    try:
        return int(text or "")
    except ValueError:
        raise InputError(f"{name}: '{text}' is not an integer (set by torchrun)") from None


def torchrun_world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment, refused when inconsistent."""
    world_size = environment_int("WORLD_SIZE")
    rank = environment_int("RANK")
    local_rank = environment_int("LOCAL_RANK", rank)
    if world_size < 1:
        raise InputError(f"WORLD_SIZE: {world_size} is not a positive number of ranks")
    if not 0 <= rank < world_size:
        raise InputError(f"RANK: {rank} is out of range for WORLD_SIZE {world_size}")
    if not 0 <= local_rank < world_size:
        raise InputError(f"LOCAL_RANK: {local_rank} is out of range for WORLD_SIZE {world_size}")
    if "MASTER_PORT" in os.environ and not 1 <= (port := environment_int("MASTER_PORT")) <= 65535:
        raise InputError(f"MASTER_PORT: {port} is not a TCP port (1 to 65535)")
    return rank, world_size, local_rank


def local_world_size(world_size: int) -> int:
    """How many ranks share this machine (torchrun's LOCAL_WORLD_SIZE; the whole world when unset)."""
    local = environment_int("LOCAL_WORLD_SIZE", world_size)
    if not 1 <= local <= world_size:
        raise InputError(f"LOCAL_WORLD_SIZE: {local} is out of range for WORLD_SIZE {world_size} (1 to {world_size})")
    return local
