"""Constraints shared by every free-text field a user names things with."""
import re

from pydantic import AfterValidator

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _no_control_chars(value: str) -> str:
    # PostgreSQL cannot store NUL in text or JSON, and a newline or escape in a name garbles tables and logs
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters (NUL, tab, newline, escape...)")
    return value


# Names, labels and metric names: `name: Annotated[str, NoControlChars] = Field(...)`
NoControlChars = AfterValidator(_no_control_chars)
