"""One rank's figures of one optimizer step (`RankStep`), gathered from every rank in the step's one all_gather
(callbacks.StepMetricsCallback). The dataclass's fields are the gathered table's columns, in their order; `pack` and
`unpack` are the one place a field has a column number. The table arrives on the CPU (collectives.all_gather_rows
moves it there once), so reading it back field by field reads nothing more from a device."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from .phases import PHASES
from .system import NAMES as SYSTEM_NAMES


@dataclass(frozen=True)
class RankStep:
    loss_part: float  # this rank's share of the step's loss: the ranks' shares add up to it
    tokens: float  # the tokens this rank trained on
    stop: float  # 1.0 when this rank was asked to stop (SIGTERM), else 0.0
    step_time_s: float
    cpu_time_s: float  # this process's CPU seconds in the step (every thread; metrics.StepClock)
    peak_allocated: float  # bytes; NaN where this step measured none (metrics.MemoryMeter)
    peak_reserved: float
    peak_activations: float
    target_tokens: float  # the step's target tokens (the whole world's)
    phases: tuple[float, ...]  # seconds of each of phases.PHASES, in that order
    system: tuple[float, ...]  # system.NAMES's figures, in that order (NaN: not readable here)

    def pack(self) -> torch.Tensor:
        """This record as one float64 row, the all_gather's input."""
        if len(self.phases) != len(PHASES) or len(self.system) != len(SYSTEM_NAMES):
            raise ValueError(f"a step record holds {len(PHASES)} phases and {len(SYSTEM_NAMES)} system figures, "
                             f"not {len(self.phases)} and {len(self.system)}")
        return torch.tensor([*(getattr(self, name) for name in SCALARS), *self.phases, *self.system],
                            dtype=torch.float64)

    @classmethod
    def unpack(cls, row: list[float]) -> RankStep:
        n, p = len(SCALARS), len(PHASES)
        return cls(**dict(zip(SCALARS, row[:n], strict=True)), phases=tuple(row[n:n + p]), system=tuple(row[n + p:]))


SCALARS = tuple(f.name for f in fields(RankStep) if f.name not in ("phases", "system"))


def gathered(table: torch.Tensor) -> list[RankStep]:
    """The all-gathered table (one packed row per rank, on the CPU) as the ranks' records, in rank order."""
    return [RankStep.unpack(row) for row in table.tolist()]
