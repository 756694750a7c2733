"""Roles and what each may do. A token has one role; a route asks for one permission."""
from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    VIEWER = "viewer"        # read plans, runs, metrics; use the planner
    SUBMITTER = "submitter"  # + store plans, submit runs, cancel their own runs
    APPROVER = "approver"    # + approve runs (and force ones that do not fit), cancel any run
    ADMIN = "admin"          # + manage tokens
    WORKER = "worker"        # a GPU worker: the agent API for the runs of its queues (backend/execution/router.py)


class Permission(StrEnum):
    READ = "read"
    SUBMIT = "submit"
    APPROVE = "approve"
    CANCEL_ANY = "cancel_any"
    INGEST = "ingest"
    AGENT = "agent"
    ADMIN = "admin"


GRANTS: dict[Role, frozenset[Permission]] = {
    Role.VIEWER: frozenset({Permission.READ}),
    Role.SUBMITTER: frozenset({Permission.READ, Permission.SUBMIT}),
    Role.APPROVER: frozenset({Permission.READ, Permission.SUBMIT, Permission.APPROVE, Permission.CANCEL_ANY}),
    Role.ADMIN: frozenset(set(Permission) - {Permission.AGENT}),
    # no READ: a worker token sees no user's runs, logs or checkpoints; what it needs of the runs it holds comes
    # through the agent API, and their metrics go in with their attempts' tokens (backend/execution/attempt_tokens.py)
    Role.WORKER: frozenset({Permission.AGENT}),
}
