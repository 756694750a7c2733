from __future__ import annotations

import math
from typing import Annotated

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from backend.core.text import NoControlChars


class PointIn(BaseModel):
    rank: int = Field(0, ge=0, le=1_000_000)
    step: int = Field(ge=0, le=2**31 - 1)
    name: Annotated[str, NoControlChars] = Field(min_length=1, max_length=64)
    value: float
    wall_time: float = Field(0.0, ge=0, le=1e11)

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float, info: ValidationInfo) -> float:
        # loss and grad_norm may be NaN/Inf: ingest raises an alert for them and stores only finite values
        if not math.isfinite(v) and info.data.get("name") not in ("loss", "grad_norm"):
            raise ValueError("value must be a finite number")
        return v


class PointsIn(BaseModel):
    points: list[PointIn] = Field(max_length=50_000)
    # the first step of the metrics file these points come from (the worker's shipper says it): the live
    # attempt's points count toward "every step stored" from there (backend/runs/transitions.missing_steps)
    first_step: int | None = Field(None, ge=0, le=2**31 - 1)
    # the wall time (unix s, the trainer's clock) of that file's first step: a file begun before the live attempt
    # started is an earlier attempt's, and its points raise no alerts (backend/runs/alerts.check)
    file_started: float | None = Field(None, ge=0, le=1e11)


class Accepted(BaseModel):
    accepted: int


class SeriesOut(BaseModel):
    rank: int
    step: list[int]
    min: list[float]
    max: list[float]
    last: list[float]


class MetricQueryOut(BaseModel):
    name: str
    series: list[SeriesOut]


class StepAxesOut(BaseModel):
    """What a chart may put on its x axis besides the step: at most `points` steps of the run (its first and last
    among them), each with the wall-clock seconds since the run's first step and the tokens trained up to it (the
    sum of the trainer's per-step `tokens`). A chart maps its steps between them linearly."""

    step: list[int]
    wall_s: list[float | None] = Field(description="null where the point carries no wall time")
    tokens: list[float]
