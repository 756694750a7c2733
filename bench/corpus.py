"""The planner against its validation corpus (bench/data/published_corpus.csv): one prediction per published row.

Shared by bench/planner_validation.py (prints the table), bench/planner_bands.py (writes the uncertainty bands the
planner reads) and tests/unit/test_planner_corpus.py (holds the errors where they are). Rows are for checking only.

A row's `compare` says which planner figure it is read against:
- `reserved_gib`, `device_total_gib`, `peak_allocated_gib`, `fits`: that field of `estimate(plan)["memory"]`;
- `ring:<field>` / `hybrid:<field>`: that option of `compare_sp_methods(plan)` (`mfu` = model FLOPs / peak);
- `<field>:packed`: packed documents of unknown length, read as the range between 512-token documents and
  whole-length ones (`training.document_len`); the error is the distance outside that range, 0 inside;
- `delta_tiled_logits_loss`: peak allocated without minus with `tiled_logits_loss`;
- `max_seq_len`: the longest context (`max_seq_len(plan)["likely"]`).

A row its own publication contradicts (bench/corpus_consistency.py's rule, published values only) is `flagged`: it
keeps its error in the tables and leaves the targets and the bands.
"""
from __future__ import annotations

import copy
import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from plan import compare_sp_methods, estimate, max_seq_len, validate
from plan.estimator import memory_point_gib

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "bench" / "data" / "published_corpus.csv"
# The shortest mean document length a packed SFT row may have (short chat turns): only the bound is used.
SHORTEST_DOCUMENT = 512
MEMORY_QUANTITIES = ("allocated", "reserved", "device_total", "max_context")
TIME_QUANTITIES = ("step_time", "tokens_per_s", "mfu")


@dataclass
class Result:
    row: dict
    predicted: float | bool | None            # the point prediction (packed rows: the whole-document end)
    predicted_range: tuple[float, float] | None = None   # packed rows: (short documents, whole documents)
    residual: float | None = None             # log(published / predicted) in the direction of memory or time
    error: float | None = None                # (predicted - published) / published; packed: outside the range
    band: tuple[float, float] | None = None   # the estimate's stated range for this figure
    covered: bool | None = None
    extra: dict = field(default_factory=dict)
    flagged: bool = False                     # its own publication contradicts it (bench/corpus_consistency.py)

    @property
    def kind(self) -> str:
        q = self.row["quantity"]
        return "memory" if q in MEMORY_QUANTITIES else "time" if q in TIME_QUANTITIES else "other"


def read_corpus(path: Path = CORPUS) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#") and line.strip()))
    for r in rows:
        r["plan"] = json.loads(r["plan"])
    return rows


def _with_training(plan: dict, **training) -> dict:
    p = copy.deepcopy(plan)
    p["training"].update(training)
    return p


def _option(plan: dict, method: str) -> dict:
    return next(o for o in compare_sp_methods(plan)["options"] if o["method"] == method)


def _figure(plan: dict, compare: str):
    """(point, band) of one planner figure for a plan."""
    method, _, name = compare.rpartition(":") if compare.startswith(("ring:", "hybrid:")) else ("", "", compare)
    if method:
        o = _option(plan, method)
        if name == "mfu":
            spec = validate(plan).spec
            assert spec is not None
            flops = spec.model.flops_per_token(spec.seq_len)
            to_mfu = flops / spec.world / spec.gpu.peak_flops(spec.dtype)
            lo, hi = o["tokens_per_s_range"]
            return o["tokens_per_s"] * to_mfu, (lo * to_mfu, hi * to_mfu)
        return o[name], o.get(f"{name}_range") if name != "fits" else o.get("verdict")
    e = estimate(plan)
    sec = e["memory"] if name in ("reserved_gib", "device_total_gib", "peak_allocated_gib", "fits") else e["throughput"]
    if name == "fits":
        return sec["fits"], sec["verdict"]
    if name == "reserved_gib":           # the band of device_total, shifted to reserved
        lo, hi = sec["device_total_gib_range"]
        f = sec["reserved_gib"] / sec["device_total_gib"]
        return sec[name], (lo * f, hi * f)
    return sec[name], sec.get(f"{name}_range")


# Bands are stated to 3 significant digits or so: a published value on the band's edge counts as inside.
EDGE = 1e-3


def _inside(x: float, band) -> bool | None:
    if not band:
        return None
    return band[0] * (1 - EDGE) <= x <= band[1] * (1 + EDGE)


def _log_ratio(published: float, predicted: float, kind: str, quantity: str) -> float:
    """log(published / predicted) for memory and step time; inverted for rates (tokens/s, MFU), so that a
    positive residual always means the planner was optimistic (too little memory, too short a step)."""
    r = math.log(published / predicted)
    return -r if quantity in ("tokens_per_s", "mfu") else r


def evaluate(row: dict) -> Result:
    plan, compare, q = row["plan"], row["compare"], row["quantity"]
    if q == "fits":
        pub = row["published"] == "True"
        point, verdict = _figure(plan, compare)
        # covered: the verdict does not contradict the outcome ("tight" is consistent with either)
        ok = verdict == "tight" or (verdict == "fits") == pub
        return Result(row, point, error=0.0 if point == pub else 1.0, covered=ok, extra={"verdict": verdict})
    pub_v = float(row["published"])
    if compare == "delta_tiled_logits_loss":
        a = estimate(plan)["memory"]["peak_allocated_gib"]
        b = estimate(_with_training(plan, tiled_logits_loss=True))["memory"]["peak_allocated_gib"]
        pred = a - b
        return Result(row, pred, error=(pred - pub_v) / pub_v)
    if compare == "max_seq_len":
        r = max_seq_len(plan)
        pred = r["likely"]
        # the published length is a memory measurement at the boundary: there the real total is the card's
        # capacity, so capacity / predicted total at that length is a memory residual
        at = estimate(_with_training(plan, seq_len=int(pub_v)))["memory"]
        residual = math.log(at["gpu_capacity_gib"] / memory_point_gib(at))
        covered = r["safe"] <= pub_v <= r["optimistic"]
        return Result(row, pred, residual=residual, error=(pred - pub_v) / pub_v, band=(r["safe"], r["optimistic"]),
                      covered=covered)
    if compare.endswith(":packed"):
        base = compare[: -len(":packed")]
        whole, whole_band = _figure(plan, base)
        short_len = min(SHORTEST_DOCUMENT, plan["training"]["seq_len"])
        short, short_band = _figure(_with_training(plan, document_len=short_len), base)
        lo, hi = min(whole, short), max(whole, short)
        if lo <= pub_v <= hi:
            err, nearest = 0.0, pub_v
        else:
            nearest = lo if pub_v < lo else hi
            err = (nearest - pub_v) / pub_v
        band = None
        if whole_band and short_band:
            band = (min(whole_band[0], short_band[0]), max(whole_band[1], short_band[1]))
        res = _log_ratio(pub_v, nearest, "time", q)
        return Result(row, whole, predicted_range=(lo, hi), residual=res, error=err, band=band,
                      covered=_inside(pub_v, band))
    pred, band = _figure(plan, compare)
    res = _log_ratio(pub_v, pred, "", q)
    covered = _inside(pub_v, band)
    return Result(row, pred, residual=res, error=(pred - pub_v) / pub_v, band=band, covered=covered)


def evaluate_all(path: Path = CORPUS) -> list[Result]:
    from bench.corpus_consistency import flagged

    rows = read_corpus(path)
    out = flagged(rows)
    results = [evaluate(r) for r in rows]
    for res in results:
        res.flagged = res.row["id"] in out
    return results


def source_key(row: dict) -> str:
    """The publication a row comes from (leave-one-source-out groups): the source up to its first space-separated
    revision marker, so the two ms-swift commits count as one source and the two TRL PRs as one."""
    s = row["source"]
    for key in ("ms-swift", "trl/pull", "accelerate/pull", "USP paper", "ALST paper", "Hugging Face blog",
                "Ulysses Lab GPU check"):
        if key in s:
            return key
    return s
