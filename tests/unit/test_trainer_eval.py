"""worker/trainer/evaluate.py's pieces that need no ranks, and the plan rules of passkey stages. The evaluations
themselves run in real SP=2, DP=2 and SP=2 x DP=2 runs (tests/integration/test_trainer_runs.py, _features.py)."""
from __future__ import annotations

import pytest

from plan import validate
from tests.tiny import tiny_plan
from worker.trainer.data import ByteTokenizer
from worker.trainer.evaluate import bucket_edges, passkey_row


def test_position_buckets_are_log2_up_to_the_sequence_length():
    assert bucket_edges(512) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert bucket_edges(384) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 384]


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_a_passkey_row_hides_the_key_at_its_depth_and_asks_for_it_last(depth):
    tok = ByteTokenizer()
    row = passkey_row(tok, 256, depth, 71432)
    text = bytes(row["input_ids"].tolist()).decode()
    assert len(row["input_ids"]) == 256
    assert row["position_ids"].tolist() == list(range(256))
    assert text.endswith("What is the pass key? The pass key is 71432")
    at = text.index("The pass key is 71432. Remember it.")
    room = 256 - len(text[text.index(" What is"):]) - len(" The pass key is 71432. Remember it. ")
    assert abs(at - 1 - round(depth * room)) <= 1, (at, room)
    targets = [t for t in row["labels"].tolist() if t != -100]
    assert bytes(targets).decode() == "71432"  # only the answer is scored


def _with_stages(*stages) -> dict:
    return tiny_plan(sp_size=2) | {"run": {"data": {"path": "d.txt"}, "stages": list(stages)}}


def test_a_passkey_stage_needs_a_training_stage_before_it_and_lengths_within_its_seq_len():
    ok = validate(_with_stages({"seq_len": 256, "steps": 2}, {"kind": "passkey", "seq_len": 512}))
    assert ok.errors == []
    assert ok.spec.plan.passkey_tests()[0][1].test_lengths(2) == [128, 256, 512]
    assert ok.spec.plan.total_steps() == 2
    first = validate(_with_stages({"kind": "passkey", "seq_len": 512}, {"seq_len": 256, "steps": 2}))
    assert [e["field"] for e in first.errors] == ["run.stages[0].kind"], first.errors
    long = validate(_with_stages({"seq_len": 256, "steps": 2}, {"kind": "passkey", "seq_len": 256,
                                                                 "lengths": [128, 512]}))
    assert [e["field"] for e in long.errors] == ["run.stages[1].lengths"], long.errors
    typo = validate(_with_stages({"seq_len": 256, "steps": 2}, {"kind": "passkey", "seq_len": 256, "deptsh": [0]}))
    assert typo.errors[0]["message"] == "unknown field; did you mean depths?", typo.errors
    # a training stage's fields are its own: no hint towards a passkey field
    wrong = validate(_with_stages({"seq_len": 256, "steps": 2, "depths": [0.5]}))
    assert wrong.errors[0]["message"].startswith("unknown field (known: kind, seq_len, steps"), wrong.errors
