"""schemathesis against the live API's OpenAPI schema (PostgreSQL, no worker): every endpoint, >= 500
generated cases with a fixed seed (derandomized Hypothesis), and not one 5xx."""
import json

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.services import own_stack

pytestmark = pytest.mark.slow
EXAMPLES_PER_OPERATION = 40
MIN_CASES = 500


@pytest.fixture(scope="module")
def fuzz_stack(tmp_path_factory):
    with own_stack(tmp_path_factory.mktemp("fuzz"), worker=False) as s:
        from tests.tiny import tiny_plan

        admin = s.api_client  # something to find: a plan and a run
        plan_id = admin.post("/api/plans", json=tiny_plan()).json()["id"]
        admin.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": "/tmp/fuzz.txt"}}})
        s.plan_id = plan_id
        yield s


def operations(base_url: str):
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    for result in schema.get_all_operations():
        op = result.ok()
        # The stream never ends by design, and revoking random token ids would sign the fuzzer itself out.
        if op.path.endswith("/stream") or (op.method.upper() == "DELETE" and op.path.startswith("/api/tokens/")):
            continue
        yield op


def test_no_server_error_on_any_endpoint(fuzz_stack):
    """Each operation gets up to EXAMPLES_PER_OPERATION derandomized cases (schemathesis' own pytest plugin does
    not run under this pytest, so Hypothesis drives its strategies directly)."""
    headers = {"Authorization": f"Bearer {fuzz_stack.admin_token}"}
    sent: list[tuple[str, int]] = []
    errors: list[str] = []
    ops = list(operations(fuzz_stack.url))

    for op in ops:
        @given(case=op.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
        def call(case):
            response = case.call(base_url=fuzz_stack.url, headers=headers, timeout=30)
            sent.append((f"{case.method} {case.path}", response.status_code))
            if response.status_code >= 500:
                errors.append(f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}")

        call()
    print(f"schemathesis: {len(sent)} cases over {len(ops)} operations, {len(errors)} server errors")
    assert not errors, "\n".join(errors[:20])
    assert len(ops) >= 18
    assert len({op for op, _ in sent}) == len(ops)
    assert len(sent) >= MIN_CASES, f"only {len(sent)} cases"


def hostile_bodies() -> dict[str, bytes]:
    """Bodies that once gave 500s: a lone surrogate, infinite and huge numbers, deep nesting, invalid
    UTF-8, a body past the size limit; each inside a valid plan and as the whole body."""
    from tests.tiny import tiny_plan

    plan = json.dumps(tiny_plan())

    def in_config(extra: str) -> bytes:
        return plan.replace('"vocab_size": 512', f'"vocab_size": 512, {extra}').encode()

    deep = {n: '{"a": ' * n + "1" + "}" * n for n in (40, 500, 900, 3000)}
    cases = {
        "surrogate-value": in_config('"note": "\\ud800"'), "surrogate-key": in_config('"\\udfff": 1'),
        "surrogate-name": plan.replace("{", '{"name": "\\ud800", ', 1).encode(),
        "inf": in_config('"rope_theta": 1e999'), "nan": in_config('"rope_theta": NaN'),
        "inf-size": plan.replace('"hidden_size": 64', '"hidden_size": 1e999').encode(),
        "huge-size": plan.replace('"hidden_size": 64', '"hidden_size": 1' + "0" * 400).encode(),
        "gpu-1e308": plan.replace('"H100-80GB"', json.dumps({k: 1e308 for k in (
            "memory_gib", "hbm_tb_per_s", "bf16_dense_tflops", "nvlink_gb_per_s_per_direction",
            "typical_internode_gb_per_s")})).encode(),
        "invalid-utf8": in_config('"note": "\xff"').replace(b"\xc3\xbf", b"\xff"),
        "too-large": in_config('"pad": "' + "a" * (2 * 1024 * 1024) + '"'),
    }
    for n, text in deep.items():
        cases[f"deep{n}"] = in_config(f'"deep": {text}')
        cases[f"deep{n}-whole"] = text.encode()
    cases["surrogate-whole"] = b'"\\ud800"'
    cases["inf-whole"] = b"1e999"
    return cases


def test_hostile_bodies_get_no_server_error_on_any_endpoint(fuzz_stack):
    """Every operation that takes a body, with each hostile body: 0 x 5xx, and the lists answer 200 afterwards."""
    import httpx

    headers = {"Authorization": f"Bearer {fuzz_stack.admin_token}", "content-type": "application/json"}
    ops = [op for op in operations(fuzz_stack.url) if op.method.upper() in ("POST", "PUT", "PATCH")]
    sent, errors = 0, []
    with httpx.Client(base_url=fuzz_stack.url, headers=headers, timeout=60) as client:
        for op in ops:
            path = op.path.replace("{run_id}", "1").replace("{plan_id}", "1").replace("{token_id}", "1")
            for name, body in hostile_bodies().items():
                sent += 1
                try:
                    r = client.request(op.method.upper(), path, content=body)
                except httpx.TransportError as e:  # the server dropped the connection: a server error too
                    errors.append(f"{op.method.upper()} {path} [{name}] -> {e!r}")
                    continue
                if r.status_code >= 500:
                    errors.append(f"{op.method.upper()} {path} [{name}] -> {r.status_code}: {r.text[:200]}")
        for path in ("/api/plans", "/api/runs", "/api/runs/1", "/api/plans/1", "/api/tokens"):
            assert client.get(path).status_code == 200, path
    print(f"hostile bodies: {sent} requests over {len(ops)} operations, {len(errors)} server errors")
    assert not errors, "\n".join(errors[:20])


# Paths and hub ids the schema cannot describe: names huggingface_hub refuses as repo ids, path parts
# over 255 bytes, and anything shaped like org/name.
HUB_LIKE = st.from_regex(r"\A[A-Za-z0-9][\w.-]{0,20}/[\w.-]{1,20}\Z")
NOT_HUB_IDS = st.sampled_from(["org/na--me", "a/..", "org/x.", "org/-x", "org/a..b", "a/.", "./a/../..", "/"])
LONG_PARTS = st.builds(lambda n, head, tail: f"{head}{'x' * n}{tail}", st.integers(250, 300),
                       st.sampled_from(["/tmp/", "org/", "", "./"]), st.sampled_from(["", "/b", "/.."]))
PATHS = st.one_of(HUB_LIKE, NOT_HUB_IDS, LONG_PARTS, st.text(min_size=1, max_size=40))


def test_run_paths_get_no_server_error(fuzz_stack):
    """POST /api/runs with run.model_path and run.data.path drawn from PATHS: 4xx, never 5xx."""
    import httpx

    errors: list[str] = []
    sent: list[int] = []
    with httpx.Client(base_url=fuzz_stack.url, timeout=30,
                      headers={"Authorization": f"Bearer {fuzz_stack.admin_token}"}) as client:
        @given(model_path=PATHS, data_path=st.one_of(st.just("/tmp/fuzz.txt"), PATHS))
        @settings(max_examples=150, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
        def call(model_path, data_path):
            body = {"plan_id": fuzz_stack.plan_id, "run": {"data": {"path": data_path}, "model_path": model_path}}
            r = client.post("/api/runs", json=body)
            sent.append(r.status_code)
            if r.status_code >= 500:
                errors.append(f"{model_path!r} / {data_path!r} -> {r.status_code}: {r.text[:200]}")

        call()
    print(f"run paths: {len(sent)} submits, {len(errors)} server errors")
    assert not errors, "\n".join(errors[:20])
    assert len(sent) >= 100
