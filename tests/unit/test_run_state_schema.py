"""The API's schema names a run's state as the RunState enum, so the dashboard's generated types carry the states
(frontend/src/lib/states.ts describes each; a state added here does not compile there until it is described)."""
from backend.main import create_app
from backend.runs.states import RunState


def test_run_and_attempt_state_are_the_run_state_enum():
    schemas = create_app().openapi()["components"]["schemas"]
    assert schemas["RunState"]["enum"] == [s.value for s in RunState]
    for model in ("RunOut", "AttemptOut"):
        assert schemas[model]["properties"]["state"] == {"$ref": "#/components/schemas/RunState"}, model
