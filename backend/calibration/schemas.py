"""HTTP shapes of calibration: predicted vs measured per run, errors per GPU type and feature set, and the opt-in
fitted correction per GPU type with its residual."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from plan.results import Estimate


class CalibrationPointOut(BaseModel):
    id: int
    source: str = Field(description='"run" (a finished run) or "gpu-check" (a bench/results/gpu-*.csv row)')
    source_ref: str
    run_id: int | None
    gpu: str
    features: str
    world: int
    seq_len: int
    predicted_peak_allocated_gib: float | None
    measured_peak_allocated_gib: float | None
    predicted_reserved_gib: float | None
    measured_reserved_gib: float | None
    predicted_device_total_gib: float | None
    measured_device_total_gib: float | None
    predicted_tokens_per_s: float | None
    measured_tokens_per_s: float | None


class FigureError(BaseModel):
    n: int
    mean_error: float | None = Field(description="Mean of (predicted - measured) / measured")
    worst_error: float | None


class Correction(BaseModel):
    factor: float = Field(description="measured = factor x predicted (least squares through the origin)")
    residual: float = Field(description="RMS of the relative misfit after the correction")
    n: int


class Errors(BaseModel):
    peak_allocated_gib: FigureError
    reserved_gib: FigureError
    device_total_gib: FigureError
    tokens_per_s: FigureError


class Corrections(BaseModel):
    peak_allocated_gib: Correction | None
    reserved_gib: Correction | None
    device_total_gib: Correction | None
    tokens_per_s: Correction | None


class GpuCalibration(BaseModel):
    gpu: str
    n: int
    errors: Errors
    correction: Corrections


class FeatureSetCalibration(BaseModel):
    gpu: str
    features: str
    n: int
    errors: Errors


class Calibration(BaseModel):
    points: list[CalibrationPointOut]
    by_gpu: list[GpuCalibration]
    by_features: list[FeatureSetCalibration]


class CorrectedFigure(BaseModel):
    predicted: float
    corrected: float
    factor: float
    residual: float
    n: int
    range: list[float] = Field(description="[low, high] of the corrected figure: the spread of this GPU type's "
                                           "measured rows around the fit (narrower than the corpus band once it "
                                           "has measured rows)")
    verdict: Literal["fits", "tight", "does_not_fit"] | None = Field(None, description="device_total_gib only: "
                                                                                       "the corrected range vs the "
                                                                                       "capacity")


class CorrectedFigures(BaseModel):
    peak_allocated_gib: CorrectedFigure | None
    reserved_gib: CorrectedFigure | None
    device_total_gib: CorrectedFigure | None
    tokens_per_s: CorrectedFigure | None


class CorrectedEstimate(BaseModel):
    """The planner's estimate, unchanged, and beside it the GPU type's fitted corrections (opt-in)."""

    gpu: str
    estimate: Estimate
    corrected: CorrectedFigures


class LoadResult(BaseModel):
    rows: int
    directory: str
