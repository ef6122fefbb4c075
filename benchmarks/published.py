"""The Zero Bubble paper's profiled settings and published bubble rates, as problems.

Source: Qi, Wan, Huang, Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024
(arXiv:2401.10241): Table 3 (model shapes: hidden size h, attention heads a, sequence
length s, microbatch size b), Table 9 (profiled T_F, T_B, T_W, T_comm in ms, per stage)
and Table 5 (bubble rates of ZB-1p, limit p·M_B, and ZB-2p, limit 2p·M_B).

Memory follows the paper's activation model per transformer layer: F allocates
M_B = sb(34h + 5as), B keeps M_W = 32sbh of it for W, W frees M_W. Problems here count
memory in units of M_B (F +1, B -(1 - M_W/M_B), W -M_W/M_B), so a limit of k means k
microbatches' activations of one linear stage. Every stage has the same times, as in
the paper's calculation.

The V placement splits each linear stage's work into two half-size chunks (2p stages,
stage s and 2p-1-s on device s): F, B, W and memory halved per chunk, so a device holds
the same work and a limit counts the same activations.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.problem import Problem, placement_devices


@dataclass(frozen=True)
class Setting:
    model: str
    p: int
    m: int
    forward: float  # ms per stage
    backward_input: float
    backward_weight: float
    comm: float
    hidden: int
    heads: int
    seq_len: int
    microbatch_size: int
    zb_1p: float  # published bubble rate at limit p·M_B
    zb_2p: float  # published bubble rate at limit 2p·M_B

    @property
    def name(self) -> str:
        return f"{self.model}-p{self.p}-m{self.m}"

    @property
    def weight_share(self) -> float:
        """M_W / M_B: the part of a forward's activation a B keeps for its W."""
        h, a, s = self.hidden, self.heads, self.seq_len
        return 32 * h / (34 * h + 5 * a * s)


def _model(model, p, hidden, heads, b, rows):
    return [Setting(model, p, m, f, bi, w, c, hidden, heads, 1024, b, one, two) for m, f, bi, w, c, one, two in rows]


# (m, T_F, T_B, T_W, T_comm, ZB-1p, ZB-2p) per model.
SETTINGS: list[Setting] = [
    *_model(
        "1.5B",
        8,
        2304,
        24,
        6,
        [
            (24, 18.522, 18.086, 9.337, 0.601, 0.1585, 0.0433),
            (32, 18.513, 18.086, 9.331, 0.626, 0.1242, 0.0039),
            (64, 18.546, 18.097, 9.321, 0.762, 0.0674, 0.0026),
        ],
    ),
    *_model(
        "6.2B",
        8,
        4096,
        32,
        3,
        [
            (24, 29.718, 29.444, 19.927, 0.527, 0.1323, 0.0029),
            (32, 29.802, 29.428, 19.530, 0.577, 0.1045, 0.0022),
            (64, 29.935, 29.621, 19.388, 0.535, 0.0554, 0.0010),
        ],
    ),
    *_model(
        "14.6B",
        16,
        5120,
        40,
        1,
        [
            (48, 11.347, 11.248, 8.132, 0.377, 0.1397, 0.0066),
            (64, 11.307, 11.254, 8.101, 0.379, 0.1088, 0.0054),
            (128, 11.325, 11.308, 8.109, 0.378, 0.0576, 0.0028),
        ],
    ),
    *_model(
        "28.3B",
        32,
        6144,
        48,
        1,
        [
            (96, 10.419, 10.207, 7.715, 0.408, 0.1421, 0.0038),
            (128, 10.408, 10.204, 7.703, 0.408, 0.1106, 0.0029),
            (256, 10.402, 10.248, 7.698, 0.460, 0.0594, 0.0018),
        ],
    ),
]


def setting_named(name: str) -> Setting:
    """The setting called `name` (e.g. "14.6B-p16-m48")."""
    found = next((s for s in SETTINGS if s.name == name), None)
    if found is None:
        raise KeyError(f"no published setting named {name!r}")
    return found


def published_problem(setting: Setting, memory_limit: float | None, placement: str = "linear") -> Problem:
    """The setting as a problem on `placement` (linear or vshape), limit in units of M_B."""
    devices = placement_devices(placement, setting.p)
    share = setting.p / len(devices)  # 1 on linear, 1/2 per V chunk
    keep = setting.weight_share
    stage = {
        "forward": setting.forward * share,
        "backward_input": setting.backward_input * share,
        "backward_weight": setting.backward_weight * share,
        "memory": {"forward": share, "backward_input": -(1 - keep) * share, "backward_weight": -keep * share},
    }
    return Problem.model_validate(
        {
            "num_devices": setting.p,
            "num_microbatches": setting.m,
            "stages": [{"device": d, **stage} for d in devices],
            "comm_time": setting.comm,
            "memory_limit": memory_limit,
        }
    )
