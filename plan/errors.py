"""Errors a user can make in a plan, as `{"field": "training.seq_len", "message": "..."}`, one per broken rule.

`field_errors` turns pydantic's validation errors into that shape for any root model: list indices print as
`run.stages[0].seq_len`, tagged-union tags are dropped, and an unknown key names the closest known one
("training.offload_optimiser: unknown field; did you mean offload_optimizer?"). The API's error handler, the
planner, `ulab plan` and `ulab train` all use it, so a mistake reads the same everywhere.
"""
from __future__ import annotations

import difflib
import typing
from collections.abc import Iterable, Sequence
from typing import Any, TypedDict

from pydantic import BaseModel, ValidationError

from .model import TAGGED_MODELS, UNION_TAGS


class FieldError(TypedDict):
    field: str
    message: str


def error(field: str, message: str) -> FieldError:
    return {"field": field, "message": message}


def dotted(loc: Sequence[Any]) -> str:
    """('run', 'stages', 0, 'seq_len') -> 'run.stages[0].seq_len' (union tags left out)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in UNION_TAGS:
            out += ("." if out else "") + str(part)
    return out


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Optional, unions, lists, dicts and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += _models_in(arg)
    return out


def known_fields(root: type[BaseModel] | None, loc: Sequence[Any]) -> list[str]:
    """Field names of the model found at `loc` below `root` (empty when the path leaves the models)."""
    candidates: list[type[BaseModel]] = [root] if root is not None else []
    for part in loc:
        if isinstance(part, int):
            continue
        if part in UNION_TAGS:  # the member of a tagged union the value was read as: its fields only
            candidates = [m for m in candidates if TAGGED_MODELS.get(str(part)) is m] or candidates
            continue
        nxt: list[type[BaseModel]] = []
        for model in candidates:
            field = model.model_fields.get(str(part))
            if field is not None:
                nxt += _models_in(field.annotation)
        candidates = nxt
    names: list[str] = []
    for model in candidates:
        names += [n for n in model.model_fields if n not in names]
    return names


def _hint(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# Extra words for a field that is missing, where the field alone does not tell the user what to give.
MISSING_HINTS: dict[str, typing.Callable[[], str]] = {}


def field_errors(exc: ValidationError | Sequence[dict], root: type[BaseModel] | None,
                 root_label: str = "plan") -> list[FieldError]:
    """pydantic errors -> FieldErrors; an error of the whole input is named `root_label`."""
    raw = exc.errors() if isinstance(exc, ValidationError) else exc
    out: list[FieldError] = []
    for e in raw:
        loc = tuple(e.get("loc", ()))
        field = dotted(loc) or root_label
        kind = e.get("type", "")
        if kind == "extra_forbidden":
            parent = loc[:-1]
            known = [n for n in known_fields(root, parent) if n not in UNION_TAGS]
            message = "unknown field" + _hint(str(loc[-1]), known)
            if known and not message.endswith("?"):
                message += f" (known: {', '.join(known)})"
        elif kind == "missing":
            message = f"{field} is required"
            more = MISSING_HINTS.get(field)
            if more:
                message += "; " + more()
        else:
            msg = str(e.get("msg", "invalid"))
            message = msg[0].lower() + msg[1:]
            if kind == "model_type" or kind == "dict_type":
                message = "a plan must be a JSON object (plan-v1)" if field == "plan" else "must be a JSON object"
            elif "input" in e and kind not in ("value_error", "assertion_error"):
                message += f", got {_short(e['input'])}"
        out.append(error(field, message))
    return out


def first_line(errors: Sequence[FieldError]) -> str:
    """`field: message` of the first error (what `ulab train` prints on its one stderr line)."""
    e = errors[0]
    return f"{e['field']}: {e['message']}"

