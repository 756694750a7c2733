"""The per-step record every rank packs into the step's one all_gather (worker/trainer/step_record.py): its fields are
the gathered table's columns, and each comes back by name."""
from __future__ import annotations

import math
from dataclasses import fields, replace

import pytest
import torch

from worker.trainer.phases import PHASES
from worker.trainer.step_record import SCALARS, RankStep, gathered
from worker.trainer.system import NAMES as SYSTEM_NAMES

RANK0 = RankStep(loss_part=0.25, tokens=64.0, stop=0.0, step_time_s=1.5, cpu_time_s=1.25, peak_allocated=1e9,
                 peak_reserved=2e9, peak_activations=3e8, target_tokens=100.0, phases=(0.1, 0.2, 0.3),
                 system=tuple(float(i) for i in range(len(SYSTEM_NAMES))))


def test_the_columns_are_the_fields_in_their_order():
    assert SCALARS + ("phases", "system") == tuple(f.name for f in fields(RankStep))
    row = RANK0.pack()
    assert row.dtype == torch.float64
    assert row.tolist() == [getattr(RANK0, name) for name in SCALARS] + list(RANK0.phases) + list(RANK0.system)
    assert len(PHASES) == len(RANK0.phases)


def test_each_rank_comes_back_field_by_field_from_the_gathered_table():
    rank1 = replace(RANK0, loss_part=0.75, stop=1.0, step_time_s=2.5, phases=(0.4, 0.5, 0.6))
    ranks = gathered(torch.stack([RANK0.pack(), rank1.pack()]))
    assert ranks == [RANK0, rank1]
    assert [r.step_time_s for r in ranks] == [1.5, 2.5]


def test_an_unmeasured_figure_stays_nan():
    unmeasured = replace(RANK0, peak_reserved=math.nan)
    (back,) = gathered(unmeasured.pack().unsqueeze(0))
    assert math.isnan(back.peak_reserved)
    assert back.peak_allocated == 1e9


def test_a_record_with_another_count_of_phases_is_refused():
    with pytest.raises(ValueError, match="phases"):
        replace(RANK0, phases=(0.1, 0.2)).pack()
