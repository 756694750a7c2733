"""Plans: estimate with the planner library, store the plan with its estimate."""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend import planner
from backend.api.errors import NotFound, UserError
from backend.plans.models import Plan
from backend.plans.schemas import PlanOut


def estimate_or_422(spec: dict) -> dict:
    """The planner's estimate; a plan that breaks a rule is a 422 naming each broken field."""
    estimate = planner.estimate(spec)
    if not estimate.get("valid"):
        raise UserError.many(422, estimate.get("errors") or [{"field": "plan", "message": "invalid plan"}])
    return estimate


def create_plan(session: Session, spec: dict, name: str = "") -> Plan:
    plan = Plan(name=name, spec=spec, estimate=estimate_or_422(spec))
    session.add(plan)
    session.commit()
    return plan


def get_plan(session: Session, plan_id: int) -> Plan:
    plan = session.get(Plan, plan_id)
    if plan is None:
        raise NotFound("plan", plan_id)
    return plan


def list_plans(session: Session, limit: int = 200) -> list[Plan]:
    return list(session.scalars(select(Plan).order_by(Plan.id.desc()).limit(limit)))


def to_out(plan: Plan) -> PlanOut:
    return PlanOut(id=plan.id, name=plan.name, created_at=plan.created_at, plan=plan.spec, estimate=plan.estimate)
