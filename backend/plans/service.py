"""Plans: validate with the plan model, estimate with the planner, store the defaulted plan with its estimate."""
from __future__ import annotations

import io
import zipfile

from sqlalchemy import select
from sqlalchemy.orm import Session

import plan as planner
from backend.core.errors import NotFound, UserError
from backend.plans.models import Plan as PlanRow
from backend.plans.schemas import PlanImport, PlanOut
from plan import Plan, importer
from plan.exports import export_files


def valid_or_422(data: Plan | dict) -> Plan:
    """The validated plan; one that breaks a rule is a 422 naming each broken field."""
    v = planner.validate(data)
    if v.plan is None or v.errors:
        raise UserError.many(422, v.errors or [{"field": "plan", "message": "invalid plan"}])
    return v.plan


def export_zip(data: Plan) -> bytes:
    """The zip of every exported file (plan.exports.export_files); 422 for an invalid plan or one with no run."""
    plan = valid_or_422(data)
    if plan.run is None:
        raise UserError(422, "run", "missing: the exported plan.json is what the trainer runs, and it needs a run "
                                    "section (steps, learning_rate, data)")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in export_files(plan).items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if name.endswith(".sh") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, text)
    return buffer.getvalue()


def create_plan(session: Session, plan: Plan, name: str = "", by: int | None = None) -> PlanRow:
    plan = valid_or_422(plan)
    row = PlanRow(name=name, spec=plan.effective(), estimate=planner.estimate(plan), created_by=by)
    session.add(row)
    session.commit()
    return row


def get_plan(session: Session, plan_id: int) -> PlanRow:
    plan = session.get(PlanRow, plan_id)
    if plan is None:
        raise NotFound("plan", plan_id)
    return plan


def list_plans(session: Session, limit: int = 200) -> list[PlanRow]:
    return list(session.scalars(select(PlanRow).order_by(PlanRow.id.desc()).limit(limit)))


def to_out(row: PlanRow) -> PlanOut:
    return PlanOut.model_validate({"id": row.id, "name": row.name, "created_at": row.created_at, "plan": row.spec,
                                   "estimate": row.estimate, "probe": row.probe})


def import_setup(body: PlanImport) -> dict:
    """The plan a pasted setup describes (plan.importer); text that does not parse is a 422 naming its line."""
    if not any((body.ds_config, body.launch, body.accelerate_config, body.training_args)):
        raise UserError(422, "ds_config", "paste a DeepSpeed config, a launch line, an Accelerate config or "
                                          "TrainingArguments")
    try:
        return importer.import_setup(
            importer.parse_json(body.ds_config, "ds_config") if body.ds_config else None,
            body.launch or None,
            importer.parse_yaml(body.accelerate_config, "accelerate_config") if body.accelerate_config else None,
            importer.parse_json(body.training_args, "training_args") if body.training_args else None,
            gpu=body.gpu, gpus_per_node=body.gpus_per_node)
    except importer.InputError as e:
        raise UserError(422, e.field, e.message) from None
