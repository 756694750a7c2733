"""The text a user pastes into an import (plan.importer), parsed: JSON and YAML with the line of the first mistake, and
a launch line (deepspeed, torchrun, accelerate launch, python) split into the launcher's options and the script's
arguments, typed as the launchers and HfArgumentParser type them. Pure: no file, no process."""
from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Any

import yaml

from . import import_keys as K
from .errors import FieldError, error


class InputError(ValueError):
    """Text that does not parse: `field` names the input, `line` the line (1-based)."""

    def __init__(self, field: str, line: int | None, message: str):
        self.field, self.line = field, line
        self.message = (f"line {line}: " if line else "") + message
        super().__init__(f"{field}: {self.message}")

    def as_error(self) -> FieldError:
        return error(self.field, self.message)


# How deep a pasted file may nest: a DeepSpeed config nests 3 levels (zero_optimization.offload_optimizer.device),
# an Accelerate config 2 (deepspeed_config.zero_stage), TrainingArguments 2; deeper is no setup (and past about 1,000
# levels the parsers run out of stack).
MAX_DEPTH = 64
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')  # a string (skipped whole) or a bracket


def too_many_digits(digits: str) -> str | None:
    """Why an integer literal cannot be read (Python's limit on converting digits to int), or None."""
    limit = sys.get_int_max_str_digits()
    count = len(digits.lstrip("+-"))
    return f"an integer of {count:,} digits, more than {limit:,}" if limit and count > limit else None


def _json_too_deep(text: str) -> int | None:
    """The line where the JSON text nests past MAX_DEPTH, or None; strings are skipped, so brackets in them do not
    count."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return None
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        token = m.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return text.count("\n", 0, m.start()) + 1
        elif token in "]}":
            depth -= 1
    return None


def _json_int(digits: str) -> int:
    if (problem := too_many_digits(digits)) is not None:
        raise ValueError(problem)
    return int(digits)


def parse_json(text: str, name: str) -> dict:
    if (line := _json_too_deep(text)) is not None:
        raise InputError(name, line, f"nested deeper than {MAX_DEPTH} levels")
    try:
        data = json.loads(text, parse_int=_json_int)
    except json.JSONDecodeError as e:
        raise InputError(name, e.lineno, f"not valid JSON: {e.msg} (column {e.colno})") from None
    except ValueError as e:  # an integer past the digit limit
        raise InputError(name, None, str(e)) from None
    if not isinstance(data, dict):
        raise InputError(name, 1, "must be a JSON object")
    return data


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing nesting past MAX_DEPTH, anchors and aliases (which can make a small text an
    exponentially large value), and integers past the digit limit, each at its line."""

    depth = 0

    def compose_node(self, parent, index):
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent) or getattr(self.peek_event(), "anchor", None):
            raise yaml.composer.ComposerError(None, None, "anchors and aliases (&name, *name) are not read", mark)
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node):
        if (problem := too_many_digits(str(node.value).replace("_", ""))) is not None:
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark)
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def parse_yaml(text: str, name: str) -> dict:
    try:
        data = yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader, bounded
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise InputError(name, mark.line + 1 if mark is not None else None, f"not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise InputError(name, 1, "must be a YAML mapping")
    return data


def typed_value(text: str | bool) -> Any:
    """A command-line value as HfArgumentParser would type it: bools, ints, floats, else the string."""
    if isinstance(text, bool):
        return text
    low = text.lower()
    if low in ("true", "yes"):
        return True
    if low in ("false", "no"):
        return False
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@dataclass
class Launch:
    launcher: str  # deepspeed | torchrun | accelerate | python
    options: dict[str, Any]  # the launcher's own options, by name without dashes
    script_args: dict[str, Any]  # the training script's --key value pairs


def _options(tokens: list[str], flags: frozenset[str]) -> tuple[dict[str, Any], list[str]]:
    """Leading --options of a launcher up to the script (the first token that is not an option or its value)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens) and tokens[i].startswith("-"):
        tok = tokens[i]
        if "=" in tok:
            k, v = tok.split("=", 1)
            out[k.lstrip("-").replace("-", "_")] = typed_value(v)
        elif tok in flags or i + 1 >= len(tokens):
            out[tok.lstrip("-").replace("-", "_")] = True
            if tok in ("-m", "--module"):
                return out, tokens[i + 1:]
        else:
            out[tok.lstrip("-").replace("-", "_")] = typed_value(tokens[i + 1])
            i += 1
        i += 1
    return out, tokens[i:]


def _script_args(tokens: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--"):
            if "=" in tok:
                k, v = tok[2:].split("=", 1)
                out[k] = typed_value(v)
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                out[tok[2:]] = typed_value(tokens[i + 1])
                i += 1
            else:
                out[tok[2:]] = True
        i += 1
    return out


def parse_launch(line: str) -> Launch:
    """`deepspeed ...`, `torchrun ...`, `python -m torch.distributed.run ...`, `accelerate launch ...` or
    `python train.py ...`: the launcher's options and the script's arguments."""
    try:
        tokens = [t for t in shlex.split(line.replace("\\\n", " ")) if t != "\\"]
    except ValueError as e:
        raise InputError("launch", None, f"not a shell line: {e}") from None
    while tokens and "=" in tokens[0] and not tokens[0].startswith("-"):  # leading VAR=value
        tokens = tokens[1:]
    if not tokens:
        raise InputError("launch", None, "empty")
    head, rest = tokens[0].rsplit("/", 1)[-1], tokens[1:]
    if head.startswith("python") and rest[:2] == ["-m", "torch.distributed.run"]:
        head, rest = "torchrun", rest[2:]
    if head == "accelerate" and rest[:1] == ["launch"]:
        launcher, (opts, script) = "accelerate", _options(rest[1:], K.ACCELERATE_FLAGS)
    elif head == "deepspeed":
        launcher, (opts, script) = "deepspeed", _options(rest, K.DEEPSPEED_LAUNCHER_FLAGS)
    elif head == "torchrun":
        launcher, (opts, script) = "torchrun", _options(rest, K.TORCHRUN_FLAGS)
    elif head.startswith("python"):
        launcher, opts, script = "python", {}, rest
    else:
        raise InputError("launch", None, f"unknown launcher {tokens[0]!r}: give a deepspeed, torchrun, "
                                         "accelerate launch or python line")
    return Launch(launcher, opts, _script_args(script[1:]))
