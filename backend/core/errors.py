"""Errors a user can cause, raised anywhere in the service and answered as 4xx with the field and the reason
({"detail": [{"field", "message"}]}) by the handlers in backend/api/errors.py. They live here, below every
package, so that raising one never imports the web framework (`import worker.tasks` loads no FastAPI)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence


class UserError(Exception):
    def __init__(self, status: int, field: str, message: str, extra: Sequence[Mapping[str, object]] = ()):
        super().__init__(message)
        self.status = status
        self.detail = [{"field": field, "message": message}] + [
            {"field": str(e["field"]), "message": str(e["message"])} for e in extra]

    @classmethod
    def many(cls, status: int, errors: Sequence[Mapping[str, object]]) -> UserError:
        first, *rest = errors
        return cls(status, str(first["field"]), str(first["message"]), rest)


class NotFound(UserError):
    def __init__(self, what: str, ident: int):
        super().__init__(404, "id", f"{what} {ident} does not exist")


class IllegalTransition(Exception):
    """A change of a run's state that the state table (backend/runs/states.py) does not allow: answered 409."""

    def __init__(self, current: str, wanted: str):
        super().__init__(f"a run in state '{current}' cannot become '{wanted}'")
        self.current, self.wanted = current, wanted
