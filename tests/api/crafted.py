"""Request bodies crafted to break a parser or a validator, each with the field its 4xx must name: the cases of
tests/api/test_no_server_errors.py, and examples of the schemathesis run (tests/api/test_schemathesis.py)."""
from __future__ import annotations

import json

from tests.tiny import tiny_plan

LONG_INT = "9" * 5000  # past Python's 4,300-digit limit on int(str)

# POST /api/plans/import: (field, text) -> the 422 names the field
IMPORT_TEXTS = [
    ("ds_config", "[" * 100000),
    ("training_args", "[" * 100000),
    ("accelerate_config", "{" * 1000),
    ("ds_config", '{"train_micro_batch_size_per_gpu": ' + LONG_INT + "}"),
    ("training_args", '{"per_device_train_batch_size": ' + LONG_INT + "}"),
    ("accelerate_config", "num_processes: " + LONG_INT),
    ("accelerate_config", "a: &x [1, 2]\nb: *x\n"),
]

# run.tokenizer / run.model_path values that are neither a directory nor a Hugging Face id
ODD_SOURCES = ["org/na--me", "a/..", "org/name.git", "/nonexistent/tokenizer", "org/-name", "org/name.", "./missing"]


def long_int_body(path: str) -> str:
    """A JSON body for `path` whose integer field holds 5,000 digits."""
    if path.endswith("/metrics"):
        return '{"points": [{"rank": 0, "step": ' + LONG_INT + ', "name": "loss", "value": 1.0}]}'
    if path == "/api/plans/import":
        return '{"ds_config": "{}", "gpus_per_node": ' + LONG_INT + "}"
    if path == "/api/runs":
        return '{"plan_id": ' + LONG_INT + ', "run": {"data": {"path": "x"}}}'
    if path.endswith("/probe"):
        return '{"steps": ' + LONG_INT + "}"
    return json.dumps(tiny_plan()).replace('"micro_batch_size": 1', '"micro_batch_size": ' + LONG_INT)


def deep_body(depth: int = 100000) -> str:
    """A metric batch nested far past any parser's recursion limit."""
    return '{"points": ' + "[" * depth + "]" * depth + "}"
