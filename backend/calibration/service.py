"""Learning from runs: every finished run (and every row of a `make gpu-check` results file) is stored as the
planner's prediction for its plan next to what was measured, and summarized per GPU type and feature set.

- Predictions are the current planner's for the stored plan (deterministic from the plan), so the error shown is
  the error of the planner that answers today.
- Measured: the highest `peak_allocated_gib` / `peak_reserved_gib` / `peak_device_total_gib` any rank reported,
  and the median `tokens_per_s` over the run's steps after the first (the first step carries start-up costs).
  A figure the run did not report (CPU ranks have no allocator statistics) stays empty.
- The fitted correction per GPU type is measured = k x predicted (least squares through the origin), shown with
  its residual (root mean square of the relative misfit) and the number of points. It is opt-in: the planner
  never applies it on its own; `corrected()` applies it when asked.
"""
from __future__ import annotations

import csv
import json
import logging
import math
import statistics
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

import plan as planner
from backend.calibration.models import CalibrationPoint
from backend.metrics.models import MetricPoint
from plan.verdict import verdict

log = logging.getLogger(__name__)
FIGURES = ("peak_allocated_gib", "reserved_gib", "device_total_gib", "tokens_per_s")
# The metric each figure is measured by (worker/trainer/callbacks.py names), and how it is summarized.
MEASURED_BY = {"peak_allocated_gib": "peak_allocated_gib", "reserved_gib": "peak_reserved_gib",
               "device_total_gib": "peak_device_total_gib"}
FEATURES = ("offload_optimizer", "offload_params", "activation_checkpointing", "checkpoint_offload", "tiled_mlp",
            "tiled_logits_loss", "liger_kernel", "expandable_segments")
MIN_POINTS_FOR_FIT = 2
# What CPU ranks are filed under: the planner predicts for GPUs only, so their rows carry no prediction ("no CPU
# prediction"), never a GPU's, and no error or correction is computed from them
CPU = "cpu"


def features_of(plan: dict) -> str:
    """The feature set of a plan, as a short stable key: `zero3+sp+liger_kernel+...`."""
    t, p = plan.get("training", {}), plan.get("parallel", {})
    parts = [f"zero{t.get('zero_stage', 3)}"]
    if p.get("sp_size", 1) > 1:
        parts.append("sp")
    parts += [f for f in FEATURES if t.get(f)]
    return "+".join(parts)


def _gpu_name(plan: dict) -> str:
    g = plan.get("hardware", {}).get("gpu")
    return g if isinstance(g, str) else (g or {}).get("name", "custom")


def predicted(plan: dict) -> dict[str, float | None]:
    est = planner.estimate(plan)
    if not est.get("valid"):
        return {f: None for f in FIGURES}
    m, t = est["memory"], est["throughput"]
    return {"peak_allocated_gib": m["peak_allocated_gib"], "reserved_gib": m.get("reserved_gib"),
            "device_total_gib": m["device_total_gib"], "tokens_per_s": t["tokens_per_s"]}


def measured_for_run(session: Session, run_id: int) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for figure, metric in MEASURED_BY.items():
        out[figure] = session.scalar(select(func.max(MetricPoint.value)).where(
            MetricPoint.run_id == run_id, MetricPoint.name == metric))
    rows = session.execute(select(MetricPoint.step, MetricPoint.value).where(
        MetricPoint.run_id == run_id, MetricPoint.name == "tokens_per_s", MetricPoint.rank == 0)
        .order_by(MetricPoint.step)).all()
    values = [v for _, v in rows[1:] if v is not None and math.isfinite(v)] or [
        v for _, v in rows if v is not None and math.isfinite(v)]
    out["tokens_per_s"] = statistics.median(values) if values else None
    return out


def _upsert(session: Session, source: str, ref: str, plan: dict, measured: dict, run_id: int | None,
            gpu: str | None = None) -> None:
    pred = {f: None for f in FIGURES} if gpu == CPU else predicted(plan)
    values: dict[str, Any] = {"gpu": gpu or _gpu_name(plan), "features": features_of(plan), "plan": plan,
                              "world": plan.get("parallel", {}).get("sp_size", 1) * plan.get("parallel", {}).get(
                                  "dp_size", 1),
                              "seq_len": plan.get("training", {}).get("seq_len", 0), "run_id": run_id}
    for f in FIGURES:
        values[f"predicted_{f}"] = pred[f]
        values[f"measured_{f}"] = measured.get(f)
    row = session.scalar(select(CalibrationPoint).where(CalibrationPoint.source == source,
                                                        CalibrationPoint.source_ref == ref))
    if row is None:
        session.add(CalibrationPoint(source=source, source_ref=ref, **values))
    else:
        for k, v in values.items():
            setattr(row, k, v)


def record_run(session: Session, run_id: int, attempt: int, spec: dict) -> None:
    """Store a finished run's prediction and measurement (called where an attempt ends, backend/execution/outcome.py).
    A run
    whose ranks reported no MFU ran on CPU ranks (no peak FLOPS to divide by): it is filed under GPU "cpu", so it
    never enters the correction of the GPU type its plan names, and is compared with no GPU's prediction."""
    plan = {k: v for k, v in (spec or {}).items() if k != "run"}
    on_gpu = session.scalar(select(func.count()).select_from(MetricPoint).where(
        MetricPoint.run_id == run_id, MetricPoint.name == "mfu")) or 0
    _upsert(session, "run", f"run {run_id} attempt {attempt}", plan, measured_for_run(session, run_id), run_id,
            gpu=None if on_gpu else CPU)


def record_measured(session: Session, source: str, ref: str, plan: dict, measured: dict, run_id: int | None,
                    gpu: str | None = None) -> None:
    """Store one measurement of a plan beside the planner's prediction (a probe's extrapolated figures: source
    "probe"); `gpu` CPU keeps CPU ranks out of the plan's GPU type and its prediction."""
    _upsert(session, source, ref, plan, measured, run_id, gpu=gpu)


def load_results(session: Session, directory: Path) -> int:
    """Load `gpu-*.csv` files (from `make gpu-check`) as measured rows; returns how many rows were read.

    Columns: `plan` (the plan as JSON, or a path to a plan file relative to the CSV's folder) and any of
    `peak_allocated_gib` (or `measured_allocated_gib`), `reserved_gib` (or `peak_reserved_gib`,
    `measured_reserved_gib`), `device_total_gib` (or `nvidia_smi_gib`) and `tokens_per_s`: bench/gpu_check.py
    writes these. A row with a `status` other than "ok" (oom, timeout, failed, skipped) is not loaded: an OOM's
    peak is the allocation that failed, not a run's peak. Lines starting with # are comments. A row whose plan is
    not valid is skipped (logged)."""
    n = 0
    for path in sorted(Path(directory).glob("gpu-*.csv")):
        with open(path, newline="") as f:
            rows = list(csv.DictReader(line for line in f if line.strip() and not line.startswith("#")))
        for i, r in enumerate(rows):
            status = (r.get("status") or "ok").strip()
            if status != "ok":  # an OOM, timed-out, failed or skipped row measured no finished run
                log.info("%s row %d: status %r, not a measurement", path.name, i + 1, status)
                continue
            raw = (r.get("plan") or "").strip()
            try:
                plan = json.loads(raw) if raw.startswith("{") else json.loads((path.parent / raw).read_text())
            except (OSError, json.JSONDecodeError) as e:
                log.warning("%s row %d: no readable plan (%s)", path.name, i + 1, e)
                continue
            if not planner.validate(plan).valid:
                log.warning("%s row %d: the plan is not valid", path.name, i + 1)
                continue

            measured = {"peak_allocated_gib": _num(r, "peak_allocated_gib", "measured_allocated_gib"),
                        "reserved_gib": _num(r, "reserved_gib", "peak_reserved_gib", "measured_reserved_gib"),
                        "device_total_gib": _num(r, "device_total_gib", "nvidia_smi_gib"),
                        "tokens_per_s": _num(r, "tokens_per_s")}
            _upsert(session, "gpu-check", f"{path.name}:{i + 1}", plan, measured, None)
            n += 1
    return n


def _num(row: dict, *names: str) -> float | None:
    """The first non-empty of a CSV row's columns `names`, as a number."""
    for name in names:
        v = (row.get(name) or "").strip()
        if v:
            return float(v)
    return None


def _errors(points: list[CalibrationPoint]) -> dict[str, dict]:
    out = {}
    for f in FIGURES:
        pairs = [(getattr(p, f"predicted_{f}"), getattr(p, f"measured_{f}")) for p in points]
        errs = [(pr - me) / me for pr, me in pairs if pr is not None and me]
        out[f] = {"n": len(errs), "mean_error": statistics.fmean(errs) if errs else None,
                  "worst_error": max(errs, key=abs) if errs else None}
    return out


def fit(points: list[CalibrationPoint], figure: str) -> dict | None:
    """measured = k x predicted through the origin, with the residual's RMS relative misfit; None below
    MIN_POINTS_FOR_FIT points."""
    pairs = [(getattr(p, f"predicted_{figure}"), getattr(p, f"measured_{figure}")) for p in points]
    pairs = [(pr, me) for pr, me in pairs if pr and me]
    if len(pairs) < MIN_POINTS_FOR_FIT:
        return None
    k = sum(pr * me for pr, me in pairs) / sum(pr * pr for pr, _ in pairs)
    residual = math.sqrt(statistics.fmean(((me - k * pr) / me) ** 2 for pr, me in pairs))
    return {"factor": k, "residual": residual, "n": len(pairs)}


def summary(session: Session) -> dict:
    points = list(session.scalars(select(CalibrationPoint).order_by(CalibrationPoint.id)))
    by_gpu: dict[str, list[CalibrationPoint]] = {}
    by_set: dict[tuple[str, str], list[CalibrationPoint]] = {}
    for p in points:
        by_gpu.setdefault(p.gpu, []).append(p)
        by_set.setdefault((p.gpu, p.features), []).append(p)
    return {
        "points": [_point_out(p) for p in points],
        "by_gpu": [{"gpu": g, "n": len(ps), "errors": _errors(ps),
                    "correction": {f: fit(ps, f) for f in FIGURES}} for g, ps in sorted(by_gpu.items())],
        "by_features": [{"gpu": g, "features": fs, "n": len(ps), "errors": _errors(ps)}
                        for (g, fs), ps in sorted(by_set.items())],
    }


def _point_out(p: CalibrationPoint) -> dict:
    return {"id": p.id, "source": p.source, "source_ref": p.source_ref, "run_id": p.run_id, "gpu": p.gpu,
            "features": p.features, "world": p.world, "seq_len": p.seq_len,
            **{f"{k}_{f}": getattr(p, f"{k}_{f}") for f in FIGURES for k in ("predicted", "measured")}}


def corrected(session: Session, plan: dict) -> dict:
    """The plan's estimate and, beside it (never in place of it), the figures with the GPU type's fitted
    corrections applied, each with its residual and point count."""
    est = planner.estimate(plan)
    gpu = _gpu_name(plan)
    points = list(session.scalars(select(CalibrationPoint).where(CalibrationPoint.gpu == gpu)))
    pred = predicted(plan)
    out: dict[str, Any] = {"gpu": gpu, "estimate": est, "corrected": {}}
    for f in FIGURES:
        c = fit(points, f)
        if c is None or pred[f] is None:
            out["corrected"][f] = None
            continue
        value = pred[f] * c["factor"]
        lo, hi = band(points, f, c["factor"])
        out["corrected"][f] = {"predicted": pred[f], "corrected": value, **c, "range": [value * lo, value * hi]}
        if f == "device_total_gib" and est.get("valid"):
            cap = est["memory"]["gpu_capacity_gib"]
            out["corrected"][f]["verdict"] = verdict(value * lo, value * hi, cap)
    return out


def band(points: list[CalibrationPoint], figure: str, factor: float) -> tuple[float, float]:
    """The range of measured / (factor x predicted) over the GPU type's measured rows (1 inside): the band of the
    corrected figure, which replaces the corpus band (plan.uncertainty) once this GPU type has measured rows. CPU
    runs are filed under GPU "cpu" (record_run), so they never enter a GPU type's band."""
    ratios = [getattr(p, f"measured_{figure}") / (factor * getattr(p, f"predicted_{figure}")) for p in points
              if getattr(p, f"predicted_{figure}") and getattr(p, f"measured_{figure}")]
    return min(1.0, *ratios), max(1.0, *ratios)
