"""Constraints on text and JSON a user sends: free-text names, and every value stored as JSON or text.

`storable_json_error` is the one check that a value can be stored and answered again: strict UTF-8 (no lone
surrogate such as "\\ud800", which JSON may spell as an escape but no UTF-8 encoder can write), finite numbers, a
bounded nesting depth and integers within Python's digit limit (`read_json` marks a longer one). The API runs it on
every request body (backend/api/limits.py) and the database session on every row it writes (backend/core/db.py),
so a value that would break a later read never reaches a table."""
import json
import math
import re

from pydantic import AfterValidator

from plan.import_text import too_many_digits

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _no_control_chars(value: str) -> str:
    # PostgreSQL cannot store NUL in text or JSON, and a newline or escape in a name garbles tables and logs
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters (NUL, tab, newline, escape...)")
    return value


# Names, labels and metric names: `name: Annotated[str, NoControlChars] = Field(...)`
NoControlChars = AfterValidator(_no_control_chars)


class UnstorableValue(ValueError):
    """A value that cannot be stored and read back; `field` is its dotted path."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


class LongInteger:
    """An integer literal past Python's digit limit, as `read_json` reads it (int() would raise)."""

    def __init__(self, problem: str):
        self.problem = problem


def _integer(digits: str) -> int | LongInteger:
    problem = too_many_digits(digits)
    return int(digits) if problem is None else LongInteger(problem)


def read_json(text: str | bytes) -> object:
    """json.loads, with an integer past the digit limit read as a LongInteger (so `storable_json_error` names its
    field) instead of raising; RecursionError past about 1,000 levels, ValueError for text that is not JSON."""
    return json.loads(text, parse_int=_integer)


def _is_utf8(text: str) -> bool:
    if text.isascii():  # the common case, without an encode
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def storable_json_error(value: object, path: str = "", max_depth: int | None = None) -> UnstorableValue | None:
    """The first reason `value` (decoded JSON, or a column's value) cannot be stored, or None. Iterative, so a
    deeply nested value costs no recursion."""
    stack: list[tuple[object, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            if not _is_utf8(item):
                return UnstorableValue(where or "body", "is not valid UTF-8 text (a lone surrogate such as \\ud800)")
        elif isinstance(item, LongInteger):
            return UnstorableValue(where or "body", f"is {item.problem}")
        elif isinstance(item, float):
            if not math.isfinite(item):
                return UnstorableValue(where or "body", f"must be a finite number, got {item}")
        elif isinstance(item, dict | list):
            if max_depth is not None and depth >= max_depth:
                return UnstorableValue(where or "body", f"is nested deeper than {max_depth} levels")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str) and not _is_utf8(key):
                    return UnstorableValue(where or "body", "has a key that is not valid UTF-8 text (a lone "
                                                            "surrogate such as \\ud800)")
                stack.append((child, _join(where, key), depth + 1))
    return None
