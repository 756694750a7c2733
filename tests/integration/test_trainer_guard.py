"""The trainer stops itself on the NaN and divergence rules (worker/trainer/stop_rules.py, the rules of
plan/guardrails.py): a real `ulab train` at lr=10 on 2 CPU ranks (torchrun, gloo) stops on the step the divergence
rule fires (the issue: "the lr=10 run stops itself by step 5"), with a checkpoint and the alert as its reason; through
the worker and the API the run ends `stopped` with one alert row for that step, whichever side saw it first."""
from __future__ import annotations

import json

import pytest

from plan.guardrails import DIVERGENCE_FROM, read_guard_record
from tests.integration.trainer_support import make_plan, metrics, train, write_documents
from tests.tiny import submit, tiny_plan, wait_for
from worker.trainer.exits import EXIT_STOPPED
from worker.trainer.stop_rules import STOPPED_FILE

pytestmark = pytest.mark.slow
STEPS = 40  # far more than it may take: a stop that came a ship + heartbeat later would show here
STOP_BY = 5  # the bound; the rule itself fires from the attempt's DIVERGENCE_FROM-th step


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    return write_documents(tmp_path_factory.mktemp("guard-data") / "docs.txt")


def test_lr_10_on_two_ranks_stops_itself_by_step_5_with_a_checkpoint(tmp_path, documents):
    plan = make_plan(tmp_path / "plan.json", documents, sp=2, steps=STEPS, learning_rate=10.0)
    run_dir = tmp_path / "run"
    proc = train(plan, run_dir, timeout=600)
    assert proc.returncode == EXIT_STOPPED, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    steps = [r["step"] for r in metrics(run_dir) if "loss" in r]
    stopped = json.loads((run_dir / STOPPED_FILE).read_text())
    print(f"lr=10, 2 ranks: stopped at step {steps[-1]} ({stopped['message']})")
    assert steps == list(range(1, steps[-1] + 1)), steps
    assert DIVERGENCE_FROM <= steps[-1] <= STOP_BY, steps
    assert stopped["kind"] == "loss_diverged"
    assert stopped["step"] == steps[-1]
    assert stopped["attempt"] == 1
    assert stopped["reason"] == f"stopped: loss diverged ({stopped['message']})"
    assert stopped["reason"] in proc.stdout + proc.stderr  # `ulab train` says why it stopped
    # the checkpoint of the step it stopped on: "resume from here" starts there
    assert (run_dir / "checkpoints" / "stage0" / f"checkpoint-{steps[-1]}" / "trainer_state.json").is_file()
    assert not (run_dir / "stages" / "stage0").exists(), "a stopped run saved a final model"


def test_a_rule_that_is_off_does_not_stop_the_trainer(tmp_path, documents):
    # one process (no torchrun): the same guard; the API still raises the alert, it stops nothing
    steps = 6
    plan = make_plan(tmp_path / "plan.json", documents, steps=steps, learning_rate=10.0, stop_on_divergence=False,
                     stop_on_nan=False)
    run_dir = tmp_path / "run"
    proc = train(plan, run_dir, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [r["loss"] for r in metrics(run_dir) if "loss" in r]
    assert len(losses) == steps, losses
    assert max(losses[2:]) > 10 * min(losses[:2]), losses  # it did diverge
    assert not (run_dir / STOPPED_FILE).exists()


def test_through_the_worker_the_run_ends_stopped_with_one_alert(api, corpus):
    run = submit(api, tiny_plan(), {"steps": STEPS, "learning_rate": 10.0, "data": {"path": str(corpus)},
                                    "checkpoint_every": 0}, name="guard-lr-10")
    done = wait_for(api, run["id"], {"stopped"}, timeout_s=400)
    assert done["last_step"] <= STOP_BY, done
    loss = api.get(f"/api/runs/{run['id']}/metrics", params={"name": "loss", "points": 10_000}).json()
    assert max(loss["series"][0]["step"]) == done["last_step"] <= STOP_BY  # the last stored step
    stops = [a for a in done["alerts"] if a["stopped"]]
    assert len(stops) == 1, done["alerts"]
    assert stops[0]["kind"] == "loss_diverged", done["alerts"]
    assert [a["kind"] for a in done["alerts"]].count("loss_diverged") == 1  # API and trainer: one row
    assert done["exit_reason"] == f"stopped: loss diverged ({stops[0]['message']})", done["exit_reason"]
    events = api.get(f"/api/runs/{run['id']}/events").json()
    assert [e["kind"] for e in events if e["kind"] == "alert" and e["stopped"]] == ["alert"]
    assert events[-1]["kind"] == "attempt_ended"
    assert events[-1]["state"] == "stopped"
    print(f"lr=10 through the worker: stopped at step {done['last_step']}")


def test_a_stop_keeps_the_checkpoint_from_before_the_divergence_and_a_resume_inherits_the_reference(tmp_path,
                                                                                                      documents):
    # one process; a checkpoint every step, one kept: the Trainer's rotation alone would leave the stop's only
    plan = make_plan(tmp_path / "plan.json", documents, steps=STEPS, learning_rate=10.0, checkpoint_every=1,
                     keep_checkpoints=1, divergence_factor=3.0)
    run_dir = tmp_path / "run"
    proc = train(plan, run_dir, timeout=600)
    assert proc.returncode == EXIT_STOPPED, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    losses = {r["step"]: r["loss"] for r in metrics(run_dir) if "loss" in r}
    stop = max(losses)
    kept = sorted(int(p.name.rsplit("-", 1)[1]) for p in (run_dir / "checkpoints" / "stage0").glob("checkpoint-*"))
    records = {k: read_guard_record(run_dir / "checkpoints" / "stage0" / f"checkpoint-{k}") for k in kept}
    print("lr=10, a checkpoint every step:", losses, "kept", records)
    within = [k for k in range(1, stop + 1) if losses[k] <= 3.0 * min(losses[s] for s in range(1, k + 1))]
    assert kept == [max(within), stop], (kept, losses)
    assert records[max(within)]["within"], records
    assert not records[stop]["within"], records
    assert records[stop]["low"] == min(losses.values()), records

    # resumed from the stop's checkpoint at lr=1e-3: the loss never comes back within 3x the run's lowest, so the
    # rule fires again on the attempt's third step, against the reference the checkpoint carried
    plan = make_plan(tmp_path / "plan.json", documents, steps=STEPS, learning_rate=1e-3, checkpoint_every=1,
                     keep_checkpoints=1, divergence_factor=3.0)
    again = train(plan, run_dir, resume=True, timeout=600)  # attempt 2 (counted on from the lock)
    assert again.returncode == EXIT_STOPPED, f"exit {again.returncode}: {again.stderr[-3000:]}"
    stopped = json.loads((run_dir / STOPPED_FILE).read_text())
    print("resumed at lr=1e-3:", stopped["message"])
    assert stopped["attempt"] == 2, stopped
    assert stopped["step"] == stop + DIVERGENCE_FROM, stopped
    assert "the run's lowest loss up to the checkpoint this attempt resumed from" in stopped["message"], stopped
    # the resumed attempt's rotation kept the checkpoint from before the divergence too
    assert (run_dir / "checkpoints" / "stage0" / f"checkpoint-{max(within)}" / "trainer_state.json").is_file()
