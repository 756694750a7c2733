"""schemathesis over every operation of the in-process API (its OpenAPI schema), with the crafted cases of
tests/api/crafted.py beside the generated ones: no 5xx, and every 4xx names a field or a parameter in
{"detail": [{"field", "message"}]}. Derandomized (a fixed seed) and bounded: EXAMPLES_PER_OPERATION cases an
operation; the count is printed."""
from __future__ import annotations

from collections import Counter

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from tests.api.conftest import as_role
from tests.api.crafted import IMPORT_TEXTS, ODD_SOURCES, deep_body, long_int_body
from tests.api.test_no_server_errors import LONG_INT_ROUTES
from tests.api.test_queue_gate import submitted_run

EXAMPLES_PER_OPERATION = 20


def unanswered(status: int, body: bytes, what: str) -> str | None:
    """Why a response breaks the rule (a 5xx; a 4xx whose detail does not name a field), or None."""
    if status >= 500:
        return f"{what} -> {status}: {body[:300]!r}"
    if 400 <= status < 500:
        import json

        try:
            detail = json.loads(body)["detail"]
        except (ValueError, KeyError, TypeError):
            detail = None
        if not (isinstance(detail, list) and detail and
                all(isinstance(d, dict) and isinstance(d.get("field"), str) and d["field"] for d in detail)):
            return f"{what} -> {status} names no field: {body[:300]!r}"
    return None


def fuzzed_operations(app):
    for result in schemathesis.openapi.from_asgi("/openapi.json", app).get_all_operations():
        op = result.ok()
        # The stream never ends by design, and revoking random token ids could sign the fuzzer itself out.
        if op.path.endswith("/stream") or (op.method.upper() == "DELETE" and op.path.startswith("/api/tokens/")):
            continue
        yield op


def crafted_requests(client, tokens, tmp_path) -> list[tuple[str, str, dict]]:
    """(method, path, request kwargs) of every crafted case; the odd tokenizers go in as run submits, then their
    approvals."""
    admin = as_role(client, tokens, "admin")
    json_headers = {**admin, "content-type": "application/json"}
    out: list[tuple[str, str, dict]] = []
    out += [("POST", "/api/plans/import", {"json": {field: text}, "headers": admin}) for field, text in IMPORT_TEXTS]
    out += [("POST", path, {"content": long_int_body(path).encode(), "headers": json_headers})
            for path in LONG_INT_ROUTES]
    out.append(("POST", "/api/runs/1/metrics", {"content": deep_body().encode(), "headers": json_headers}))
    for name in ODD_SOURCES:
        for field in ("tokenizer", "model_path"):
            run_id = submitted_run(client, admin, tmp_path, run={field: name})
            if run_id is not None:
                out.append(("POST", f"/api/runs/{run_id}/approve", {"headers": admin}))
    return out


def test_no_server_error_and_every_4xx_names_a_field(app, client, tokens, tmp_path):
    headers = as_role(client, tokens, "admin")
    submitted_run(client, headers, tmp_path)  # something for the ids to find: a plan and a run
    statuses: Counter[int] = Counter()
    problems: list[str] = []
    ops = list(fuzzed_operations(app))
    for op in ops:
        @given(case=op.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
        def call(case):
            r = case.call(headers=headers)
            statuses[r.status_code] += 1
            if (why := unanswered(r.status_code, r.content, f"{case.method} {case.formatted_path}")) is not None:
                problems.append(why)

        call()
    generated = sum(statuses.values())
    crafted = crafted_requests(client, tokens, tmp_path)
    for method, path, kwargs in crafted:
        r = client.request(method, path, **kwargs)
        statuses[r.status_code] += 1
        if (why := unanswered(r.status_code, r.content, f"{method} {path} (crafted)")) is not None:
            problems.append(why)
    print(f"schemathesis: {generated} generated + {len(crafted)} crafted cases over {len(ops)} operations; "
          f"statuses {dict(sorted(statuses.items()))}; {len(problems)} unanswered")
    assert not problems, "\n".join(problems[:20])
    assert len(ops) >= 40
    assert generated >= 10 * len(ops)
